"""Split profiled training steps by op family: where the time outside GEMM goes.

Input: ``torch.profiler`` events of steps each wrapped in a ``profilednn::step`` region
(the loss in ``profilednn::loss``; PyTorch wraps the update in ``Optimizer.step#...``),
one row per event, parents before children. Every event's *self* time goes to one family,
so the families of a step add up to the step's duration:

1. inside an ``Optimizer.*`` region: ``optimizer``; inside ``profilednn::loss``: ``loss``;
2. else the family of the event's own name, or of its nearest ancestor that has one (the
   ``aten::empty`` inside a convolution is the convolution's; a ``copy_`` inside a conv
   backward is a copy);
3. else ``other``: autograd engine nodes, dispatch, Python between ops, unclassified ops.

The op sets are the project's vocabulary (``profilednn.vocabulary``: the GEMM, elementwise,
reduction, copy, fill and layout ops) and ``analysis.taxonomy`` says which events are
wrappers; the families are coarser than the replay's (``vocabulary.op_family``): convolutions
(the replay takes them as primitives, not ops), batch norm apart from the other norms,
softmax and norms with the reductions, and copies with layout changes (the replay files
``copy_``/``clone`` under elementwise, taxonomy ``to``/``contiguous`` under bookkeeping;
both are layout and dtype traffic here). A loss
written from generic ops (focal loss) counts as ``loss`` in its forward only: its backward
ops run in the autograd engine and land in their own families. Under ``torch.compile``
the generated kernels run inside ``## Call CompiledFxGraph`` without events of their own:
their time is ``compiled``.
"""

from __future__ import annotations

import re

import polars as pl

from ..analysis.taxonomy import NON_KERNEL_NAMESPACES
from ..vocabulary import COPY_OPS, ELEMENTWISE_OPS, FILL_OPS, GEMM_OPS, LAYOUT_OPS, REDUCE_OPS

STEP_REGION = "profilednn::step"
LOSS_REGION = "profilednn::loss"
OPTIMIZER_REGION = "Optimizer."  # torch.optim's record_function: Optimizer.step#SGD.step
# ProfileDNN's own regions (their self time is time between ops); ``profilednn::bn_act_forward``
# and the other kernels' custom ops share the namespace but are ops.
REGIONS = (STEP_REGION, LOSS_REGION, "profilednn::data")
COMPILED_GRAPH = "## Call CompiledFxGraph"
FUSED_BATCH_NORM = "bn_act_"  # ProfileDNN's fused batch-norm custom ops (kernels/batch_norm.py)

GEMM = "gemm"
FAMILIES: tuple[str, ...] = ("gemm", "batch_norm", "elementwise", "reduce_norm", "pooling", "copy_layout",
                             "optimizer", "loss", "compiled", "other")
"""Every family, GEMM/conv first; the rest is the step outside GEMM."""

DESCRIPTIONS: dict[str, str] = {
    "gemm": "convolutions and matmuls, forward and backward",
    "batch_norm": "batch norm, forward and backward",
    "elementwise": "activations, adds, multiplies, dropout",
    "reduce_norm": "reductions, softmax, layer/group norms",
    "pooling": "max/avg pooling, forward and backward",
    "copy_layout": "copies, dtype casts, layout conversions, concatenation",
    "optimizer": "the optimizer's update and zero_grad",
    "loss": "the loss function (forward; its own backward kernels)",
    "compiled": "torch.compile's generated kernels",
    "other": "framework overhead: Python, dispatch, autograd, unclassified ops",
}

_GEMM_NAME = re.compile(rf"(^|_)(conv(olution|_|\d|$)|linear|matmul|{'|'.join(sorted(GEMM_OPS))}|einsum)"
                        r"|^_scaled_dot_product")
_COPY_OPS = COPY_OPS | LAYOUT_OPS
_REDUCE_OPS = REDUCE_OPS | {"amax", "amin", "max", "min", "var", "std", "var_mean", "logsumexp", "norm",
                            "linalg_vector_norm", "cumsum", "prod", "argmax"}
_ELEMENTWISE_EXTRA = FILL_OPS | {"dropout", "native_dropout", "native_dropout_backward", "bernoulli_",
                                  "_masked_scale", "hardswish", "hardswish_", "elu", "softplus", "mish"}


def event_family(name: str) -> str | None:
    """The family of one profiler event by its own name; None for wrappers, bookkeeping
    and unknown ops (they take the family of the op that called them)."""
    if name.startswith(COMPILED_GRAPH) or "cpp_fused" in name:
        return "compiled"
    if name.startswith(OPTIMIZER_REGION):
        return "optimizer"
    if FUSED_BATCH_NORM in name:  # profilednn::bn_act_* and the autograd wrapper around them
        return "batch_norm"
    namespace, sep, short = name.partition("::")
    if not sep or namespace in NON_KERNEL_NAMESPACES:
        return None
    if short.startswith(("_foreach_", "_fused_")):
        return "optimizer"
    if "batch_norm" in short:
        return "batch_norm"
    if "loss" in short or "cross_entropy" in short:
        return "loss"
    if short in _COPY_OPS:
        return "copy_layout"
    if "pool" in short:
        return "pooling"
    if _GEMM_NAME.search(short):
        return "gemm"
    base = short.removesuffix("_backward")
    if "norm" in short or "softmax" in short or base in _REDUCE_OPS:
        return "reduce_norm"
    if (namespace == "aten" and short in ELEMENTWISE_OPS) or base in ELEMENTWISE_OPS or base in _ELEMENTWISE_EXTRA:
        return "elementwise"
    return None


def classify(events: pl.DataFrame) -> pl.DataFrame:
    """``events`` (``op``, ``self_ms``, ``parent``: the row index of the enclosing event,
    -1 for none; parents before children) with ``family`` and ``step`` (the 0-based
    ``profilednn::step`` region the event ran in, null outside every step)."""
    names = events["op"].to_list()
    parents = events["parent"].to_list()
    families: list[str] = []
    steps: list[int | None] = []
    region: list[str | None] = []
    inner: list[str | None] = []
    n_steps = 0
    for i, name in enumerate(names):
        p = parents[i] if parents[i] is not None and 0 <= parents[i] < i else -1
        step = steps[p] if p >= 0 else None
        if name == STEP_REGION:
            step, n_steps = n_steps, n_steps + 1
        own = event_family(name)
        reg = region[p] if p >= 0 else None
        if reg is None and (name.startswith(OPTIMIZER_REGION) or name == LOSS_REGION):
            reg = "optimizer" if name.startswith(OPTIMIZER_REGION) else "loss"
        near = own or (inner[p] if p >= 0 else None)
        region.append(reg)
        inner.append(near)
        steps.append(step)
        families.append(reg or near or "other")
    return events.with_columns(pl.Series("family", families, dtype=pl.Utf8),
                               pl.Series("step", steps, dtype=pl.Int64))


# The columns of family_split's table.
FAMILY_SCHEMA = {"family": pl.Utf8, "ms_per_step": pl.Float64, "share_pct": pl.Float64, "top_ops": pl.Utf8}


def family_split(events: pl.DataFrame, top: int = 3) -> tuple[pl.DataFrame, float, int]:
    """Per family: ``ms_per_step`` (self time over the profiled steps), ``share_pct`` of the
    step and ``top_ops`` (its heaviest events, ms per step, ``aten::`` left out; time between
    ops in a ProfileDNN region as "(between ops)"); families with no time are left out, GEMM
    first, then the rest heaviest first. Returns (table, mean step ms, steps)."""
    done = classify(events)
    regions = done.filter(pl.col("op") == STEP_REGION)
    n = regions.height
    if n == 0:
        raise ValueError(f"no {STEP_REGION} region among the profiled events")
    step_ms = float(regions["dur_ms"].mean())
    inside = done.filter(pl.col("step").is_not_null())
    label = (pl.when(pl.col("op").is_in(REGIONS)).then(pl.lit("(between ops)"))
             .otherwise(pl.col("op").str.replace("^aten::", "")
                        .str.replace("^autograd::engine::evaluate_function: ", "autograd ")))
    per_op = (inside.with_columns(label.alias("op"))
              .group_by("family", "op").agg((pl.col("self_ms").sum() / n).alias("ms"))
              .sort(["family", "ms", "op"], descending=[False, True, False]))
    tops = per_op.group_by("family", maintain_order=True).agg(
        pl.format("{} {}", pl.col("op"), pl.col("ms").round(2).cast(pl.Utf8)).head(top).str.join(", ")
        .alias("top_ops"))
    table = (per_op.group_by("family").agg(pl.col("ms").sum().alias("ms_per_step"))
             .join(tops, on="family", how="left")
             .filter(pl.col("ms_per_step") > 0)
             .with_columns((100.0 * pl.col("ms_per_step") / step_ms).alias("share_pct"))
             .sort([pl.col("family") != GEMM, pl.col("ms_per_step")], descending=[False, True]))
    return table.select(*FAMILY_SCHEMA).cast(FAMILY_SCHEMA), step_ms, n


__all__ = ["DESCRIPTIONS", "FAMILIES", "FAMILY_SCHEMA", "GEMM", "LOSS_REGION", "STEP_REGION", "classify",
           "event_family", "family_split"]

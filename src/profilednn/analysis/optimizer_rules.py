"""Advice rule ``fused_optimizer``: the optimizer step runs per-parameter ops where a fused
(or multi-tensor) implementation exists.

torch.optim's Adam, AdamW, SGD and Adagrad have fused CPU kernels (``fused=True``: one
kernel updates every parameter). Built without ``fused=`` or ``foreach=`` they run, on a
CPU, a Python loop of several small ops per parameter: PyTorch turns its multi-tensor path
on by default for CUDA tensors only. Capture records each optimizer class that stepped
with its ``fused``/``foreach``/``differentiable`` (``manifest["optimizers"]``); a Run
without that record (an older capture) is read from its op names (``aten::_fused_*``,
``aten::_foreach_*``, ``Optimizer.step#Name.step``). Listed in ``rules.RULE_MODULES``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import polars as pl

from ..recipe_catalogue import FUSED_OPTIMIZER
from .actions import optimizer_fixes, profiled_step_op
from .rulebook import Advice, rule, severity_for
from .taxonomy import is_elementwise_op

if TYPE_CHECKING:
    from .view import RunView

# The optimizer phase (update + zero_grad) >= 5% of the step: below it, even a fused kernel
# that removed the whole phase would gain less than run-to-run noise of a CPU step.
OPTIMIZER_SHARE_MIN_PCT = 5.0
# Half the phase: a fused kernel makes one pass over parameters, gradients and state where the
# loop makes several and dispatches each op per parameter; the phase as profiled also carries
# per-op profiler overhead, which a fused kernel does not remove from an unprofiled step.
FUSED_OPTIMIZER_SAVING = 0.5
_FUSED_OP = re.compile(r"aten::_fused_(sgd|adam|adamw|adagrad)_?$")
_FOREACH_OP = "_foreach_"


def _is_torch(record: dict[str, Any]) -> bool:
    module = str(record.get("module") or "")
    return module == "torch.optim" or module.startswith("torch.optim.")


def already_fast(record: dict[str, Any]) -> str | None:
    """Why this optimizer needs no advice (``fused=True``; a torch optimizer with
    ``foreach=True``; ``differentiable=True``, which has no fused kernel), or None."""
    if record.get("fused"):
        return "fused=True"
    if _is_torch(record) and record.get("foreach") is True:
        return "foreach=True"
    if _is_torch(record) and record.get("differentiable"):
        return "differentiable=True"
    return None


def _optimizer_ops(a: "RunView") -> pl.DataFrame | None:
    return a.ops.filter(pl.col("phase") == "optimizer") if a.ops is not None and a.ops.height else None


@rule(FUSED_OPTIMIZER)
def fused_optimizer(a: "RunView") -> Advice | None:
    """The optimizer phase is >= 5% of the step and an optimizer runs unfused: a torch
    Adam/AdamW/SGD/Adagrad built without ``fused=``/``foreach=`` (or another class with a
    fused drop-in, e.g. a LAMB -> ``profilednn.kernels.FusedLAMB``).

    Quiet when every optimizer already runs ``fused=True`` (or a torch one ``foreach=True``),
    when the Run says nothing of which optimizer ran (no record, no profiled
    ``Optimizer.step#Name.step``), or when the phase is smaller. Gain: half the optimizer phase time (``FUSED_OPTIMIZER_SAVING``).
    """
    steps = a.steps
    if steps is None or "optimizer_ms" not in steps.columns or steps["optimizer_ms"].drop_nulls().len() == 0:
        return None
    if not a.step_ms:
        return None
    opt = float(steps["optimizer_ms"].mean())
    share = opt / a.step_ms * 100.0
    if share < OPTIMIZER_SHARE_MIN_PCT:
        return None
    names = [str(n) for n in a.ops["op"].unique().to_list()] if a.ops is not None and a.ops.height else []
    # names from every phase: the Optimizer.step region may start just before the phase begins
    if any(_FUSED_OP.match(n) for n in names):
        return None
    phase_ops = _optimizer_ops(a)
    records = [r for r in a.manifest.get("optimizers") or [] if isinstance(r, dict)]
    if records:
        records = [r for r in records if already_fast(r) is None]
        if not records:
            return None  # every optimizer runs fused (or multi-tensor) already
    elif profiled_step_op(names) is None:
        return None  # no record and no profiled step: nothing says which optimizer ran
    elif phase_ops is not None and phase_ops.filter(pl.col("op").str.contains(_FOREACH_OP)).height:
        return None  # no record: the multi-tensor path ran
    fixes = optimizer_fixes(records, names)
    if not fixes:
        return None
    name = " and ".join(f.current for f in fixes)
    built = ", built without fused= or foreach= (a per-parameter loop on a CPU)" if records and all(
        _is_torch(r) and r.get("fused") is None and r.get("foreach") is None for r in records) else ""
    detail = ""
    if phase_ops is not None:
        per_param = phase_ops.filter(is_elementwise_op(pl.col("op")))
        foreach = phase_ops.filter(pl.col("op").str.contains(_FOREACH_OP))
        detail = (f"; {per_param['calls'].sum() / a.n_steps:.0f} per-parameter elementwise calls and "
                  f"{foreach['calls'].sum() / a.n_steps:.0f} _foreach_ calls per step")
    gain = share * FUSED_OPTIMIZER_SAVING
    return Advice(
        rule=FUSED_OPTIMIZER,
        severity=severity_for(gain),
        evidence=(f"{name}{built}: its step takes {share:.1f}% of the step ({opt:.2f} ms per step){detail}; "
                  f"estimated gain: half of that phase ({opt * FUSED_OPTIMIZER_SAVING:.2f} ms per step)"),
        estimated_gain_pct=gain,
        action=" ".join(f.action() + "." for f in fixes),
    )


__all__ = ["FUSED_OPTIMIZER_SAVING", "OPTIMIZER_SHARE_MIN_PCT", "already_fast", "fused_optimizer"]

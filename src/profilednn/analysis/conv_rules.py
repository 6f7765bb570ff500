"""Advice rule ``native_conv_fallback``: convolutions PyTorch ran in native ATen kernels.

PyTorch sends an fp32 CPU convolution to oneDNN unless (``ConvParams::use_mkldnn`` in
ATen's ``Convolution.cpp``): it is 1x1, stride 1, undilated, with batch < 16 and 1
thread ("THNN is faster single-threaded"); or groups 1, a kernel <= 3 in some dimension,
batch 1 and at most 20480 input elements; or oneDNN is disabled. BF16/FP16 go to oneDNN
only where the CPU has them natively; other dtypes never do. The memory layout
(channels-last) does not enter that choice. The fallback runs ``_slow_conv2d_forward``/
``_backward`` (im2col + GEMM), ``thnn_conv*`` or ``slow_conv*`` ops, which the Run records
as framework ops, not oneDNN primitives.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from ..vocabulary import NATIVE_CONV_PATTERN
from .next_steps import run_argument
from .rulebook import Advice, denominator, rule, severity_for

if TYPE_CHECKING:
    from .view import RunView

NATIVE_CONV_MIN_PCT = 2.0  # fallback kernels >= 2% of the step
MKLDNN_BATCH_MIN = 16      # from this batch size on, 1x1 convolutions take oneDNN at 1 thread
SMALL_INPUT_NUMEL = 20480


def _shapes(text: str | None) -> list:
    from ..projection.cases import parse_shapes  # pure parsing, no torch

    return parse_shapes(text)


def fallback_cause(op: str, input_shapes: str | None, dtypes: str | None, threads: int | None,
                   native_bf16: bool | None = None) -> str:
    """Why PyTorch did not use oneDNN for this call: ``threads``, ``batch``, ``dtype`` or ``?``."""
    shapes, dts = _shapes(input_shapes), _shapes(dtypes)
    backward = op.endswith("_backward")
    x = shapes[1] if backward and len(shapes) > 1 else (shapes[0] if shapes else None)
    w = shapes[2] if backward and len(shapes) > 2 else (shapes[1] if len(shapes) > 1 else None)
    dt = (dts[1] if backward and len(dts) > 1 else dts[0]) if dts else "float"
    if dt not in ("float", ""):
        return "dtype"
    if not (isinstance(x, list) and isinstance(w, list) and len(x) >= 3 and len(w) >= 3):
        return "?"
    one_by_one = all(k == 1 for k in w[2:])
    if threads == 1 and one_by_one and x[0] < MKLDNN_BATCH_MIN:
        return "threads"
    numel = 1
    for v in x:
        numel *= v
    if x[0] == 1 and numel <= SMALL_INPUT_NUMEL:
        return "batch"
    return "?"


CAUSE_TEXT = {
    "threads": ("1 thread with 1x1 stride-1 convolutions at batch < 16: PyTorch's rule keeps "
                "them out of oneDNN single-threaded"),
    "batch": "batch 1 with small inputs (<= 20480 elements): PyTorch prefers its native kernel",
    "dtype": ("a dtype oneDNN does not take here (BF16/FP16 need native support, fp64 never "
              "goes to oneDNN)"),
    "?": "oneDNN disabled (torch.backends.mkldnn.enabled = False) or a shape oneDNN refuses",
}
CAUSE_ACTION = {
    "threads": ("give each rank >= 2 threads (fewer ranks x more threads), or a per-rank batch "
                ">= 16; channels_last does not change PyTorch's choice. Check first with "
                "`profilednn project {run} --threads 2 --validate` (replays the conv calls where "
                "PyTorch picks oneDNN) or the `threads` recipe of `profilednn optimize`"),
    "batch": "train with batch > 1 (or accumulate gradients over larger batches)",
    "dtype": ("run convolutions in fp32, or in BF16 only on a CPU with native BF16 "
              "(avx512_bf16/AMX; `profilednn machine` lists the native dtypes)"),
    "?": "re-enable oneDNN (torch.backends.mkldnn.enabled = True) and check the shapes",
}


@rule("native_conv_fallback")
def native_conv_fallback(a: "RunView") -> Advice | None:
    """Convolutions ran in native ATen kernels (``_slow_conv2d_*``, ``thnn_conv*``, NNPACK).

    Share: the fallback ops' self time per step. Gain: for the thread cause, the
    share times (1 - 1/cores), as if oneDNN on all cores ran them at the cores' speed-up;
    otherwise half the share (oneDNN's typical 2x over im2col + GEMM). Estimates.
    """
    ops = a.ops
    if ops is None or ops.is_empty():
        return None
    slow = ops.filter(pl.col("op").str.contains(NATIVE_CONV_PATTERN))
    if slow.is_empty():
        return None
    denom, of_what = denominator(a)
    if not denom:
        return None
    col = "self_time_ms"  # thnn_conv2d wraps _slow_conv2d_forward: inclusive times would double
    ms = float(slow[col].sum() or 0.0) / a.n_steps
    share = 100.0 * ms / denom
    if share < NATIVE_CONV_MIN_PCT:
        return None
    fp = a.fingerprint
    threads = int(fp["threads"]) if fp.get("threads") else None
    cores = int(fp.get("cores") or 0) or None
    causes: dict[str, float] = {}
    for op, shp, dts, t in slow.select("op", "input_shapes", "dtypes", col).iter_rows():
        c = fallback_cause(op, shp, dts, threads)
        causes[c] = causes.get(c, 0.0) + float(t or 0.0)
    main = max(causes, key=causes.get)
    gain = share * (1.0 - 1.0 / cores) if main == "threads" and cores and cores > 1 else share * 0.5
    top = (slow.group_by("op").agg(pl.col(col).sum(), pl.col("calls").sum())
           .sort(col, descending=True))
    listed = ", ".join(f"{o} {t / a.n_steps:.1f} ms x{c // a.n_steps}" for o, t, c in
                       top.head(3).iter_rows())
    split = "; ".join(f"{k}: {100 * v / sum(causes.values()):.0f}%" for k, v in causes.items())
    return Advice(
        rule="native_conv_fallback",
        severity=severity_for(gain),
        evidence=(f"convolutions in native ATen kernels instead of oneDNN take {ms:.1f} ms per "
                  f"step ({share:.1f}% {of_what}): {listed}; cause: {CAUSE_TEXT[main]}"
                  + (f" (by time: {split})" if len(causes) > 1 else "")
                  + (f"; threads={threads}" if threads else "")),
        estimated_gain_pct=gain,
        action=f"Send them back to oneDNN: {CAUSE_ACTION[main].format(run=run_argument(a))}.",
    )


__all__ = ["fallback_cause", "native_conv_fallback"]

"""Roofline: the fastest a primitive could run given the machine's FLOP/s and bytes/s.

attainable time = max(FLOPs / peak FLOP/s, bytes / bandwidth), with the peak of the
primitive's dtype at the thread count in question and the compulsory bytes (every tensor
read or written once). Arithmetic intensity = FLOPs / bytes; a primitive is compute
bound when its intensity is above the machine's ridge point (peak / bandwidth).
oneDNN primitives bring their FLOPs (benchdnn's convention) and bytes from the Run's
table; framework ops get them from the simple per-family model below (stated as such).
"""

from __future__ import annotations

import math
from typing import Any

import polars as pl

from ..vocabulary import PROFILER_TYPE_BYTES, op_family
from .machine import MachineProfile

# FLOPs per output element of elementwise-like families (a model, not a count).
FLOPS_PER_ELEMENT = {"elementwise": 1.0, "norm": 8.0, "reduce": 1.0, "softmax": 5.0, "loss": 3.0}


def attainable_ms(flops: float, nbytes: float, peak_gflops: float, bandwidth_gbs: float) -> float:
    """Roofline time in ms: the larger of compute time at peak and transfer time at bandwidth."""
    compute = (flops or 0.0) / (peak_gflops * 1e9) if peak_gflops > 0 else math.inf
    memory = (nbytes or 0.0) / (bandwidth_gbs * 1e9) if bandwidth_gbs > 0 else math.inf
    return max(compute, memory) * 1e3


def arithmetic_intensity(flops: float, nbytes: float) -> float | None:
    """FLOPs per byte (None when no bytes move)."""
    return None if not nbytes else (flops or 0.0) / nbytes


def bound(flops: float, nbytes: float, peak_gflops: float, bandwidth_gbs: float) -> str:
    """``compute`` or ``memory``: which roof limits this primitive."""
    compute = (flops or 0.0) / peak_gflops
    memory = (nbytes or 0.0) / bandwidth_gbs
    return "compute" if compute >= memory else "memory"


def _numel(shape: Any) -> int:
    if not isinstance(shape, list) or any(not isinstance(v, int) for v in shape):
        return 0
    return math.prod(shape) if shape else 1


def op_flops_bytes(op: str, shapes: list, dtypes: list) -> tuple[float, float]:
    """FLOPs and compulsory bytes of a framework op at its recorded shapes (a model).

    GEMMs count 2*M*N*K (torch.utils.flop_counter's convention); other families count
    a few FLOPs per element; bytes are every tensor input read once plus the output
    written once (the output is taken as large as the largest input, except for
    reductions, pooling and GEMMs whose output size follows from the shapes).
    """
    family = op_family(op) or "elementwise"
    name = op.split("::", 1)[-1]
    tensors = [(s, PROFILER_TYPE_BYTES.get(d, 4)) for s, d in zip(shapes, dtypes)
               if d in PROFILER_TYPE_BYTES and isinstance(s, list) and (s or d in ("float",))]
    in_bytes = float(sum(_numel(s) * b for s, b in tensors))
    elt = PROFILER_TYPE_BYTES.get(dtypes[0], 4) if dtypes else 4
    largest = max((_numel(s) for s, _ in tensors), default=0)
    if family == "gemm":
        mats = [s for s, _ in tensors if isinstance(s, list) and len(s) >= 2]
        if name in ("mm", "bmm") and len(mats) >= 2:
            a, b = mats[0], mats[1]
        elif len(mats) >= 2:
            a, b = mats[-2], mats[-1]
        else:
            return 0.0, in_bytes
        batch = math.prod(a[:-2]) if len(a) > 2 else 1
        m, k, n = a[-2], a[-1], b[-1]
        out = batch * m * n * elt
        return 2.0 * batch * m * n * k, in_bytes + out
    if family == "pool":
        if name.endswith("_backward"):
            return float(largest), in_bytes + largest * elt
        out_elems = largest // 4 if "adaptive" not in name else (
            _numel(shapes[0][:2]) if shapes and isinstance(shapes[0], list) else 0)
        return float(largest), in_bytes + out_elems * elt * (3 if "indices" in name else 1)
    if family == "reduce":
        return float(largest), in_bytes
    written = 0 if name.endswith("_") else largest * elt
    if name == "native_batch_norm_backward" or name == "native_layer_norm_backward":
        written = largest * elt
    return FLOPS_PER_ELEMENT.get(family, 1.0) * largest, in_bytes + written


def add_roofline(df: pl.DataFrame, machine: MachineProfile, threads: int | None,
                 dtype_col: str = "dtype") -> pl.DataFrame:
    """Add ``ai``, ``attainable_ms`` and ``bound`` (per call) from ``flops`` and ``bytes``.

    A dtype the machine has no native peak for (BF16 on a CPU without AVX512_BF16/AMX)
    is held against the fp32 peak: that is the ceiling its emulation can approach.
    """
    bw = machine.bandwidth_at(threads)
    peaks = {}
    for dt in set(df[dtype_col].to_list()) if dtype_col in df.columns else {"fp32"}:
        key = dt if dt in machine.native_dtypes else "fp32"
        peaks[dt] = machine.gemm_peak_gflops(key, threads)
    ai, att, bnd = [], [], []
    dts = df[dtype_col].to_list() if dtype_col in df.columns else ["fp32"] * df.height
    for f, b, dt in zip(df["flops"].to_list(), df["bytes"].to_list(), dts):
        f, b = float(f or 0.0), float(b or 0.0)
        peak = peaks.get(dt) or machine.gemm_peak_gflops("fp32", threads)
        ai.append(arithmetic_intensity(f, b))
        att.append(attainable_ms(f, b, peak, bw) if (f or b) else None)
        bnd.append(bound(f, b, peak, bw) if (f or b) else None)
    return df.with_columns(
        pl.Series("ai", ai, dtype=pl.Float64),
        pl.Series("attainable_ms", att, dtype=pl.Float64),
        pl.Series("bound", bnd, dtype=pl.Utf8),
    )


__all__ = ["add_roofline", "arithmetic_intensity", "attainable_ms", "bound", "op_flops_bytes"]

"""Per-dtype model FLOPs, GEMM peaks and MFU.

A step whose convolutions run in BF16 and whose head runs in fp32 reaches a different
ceiling for each part, so MFU holds each dtype's FLOPs against that dtype's peak:

    mfu = (sum over dtypes d of FLOPs_d / peak_d) / measured step time

the time the step's FLOPs would take at peak over the time they took. A dtype the
machine only emulates (BF16 without avx512_bf16/AMX) has no native ceiling; its FLOPs
are held against the fp32 peak, the best its emulation can approach (as the roofline does).
"""

from __future__ import annotations

from typing import Any, Mapping

import polars as pl

from ..vocabulary import COMPUTE_DRIVERS, cfg_dtype
from .machine import MachineProfile, Measurement

MODEL_FLOP_DRIVERS = tuple(sorted(COMPUTE_DRIVERS))  # conv, deconv, ip, matmul
GEMM_OP_FAMILY = "gemm"


def _grouped(df: pl.DataFrame, flops: pl.Expr) -> dict[str, float]:
    if df.is_empty():
        return {}
    dtype = pl.col("dtype").fill_null("fp32") if "dtype" in df.columns else pl.lit("fp32")
    out = df.select(dtype.alias("d"), flops.alias("f")).group_by("d").agg(pl.col("f").sum())
    return {str(d): float(f or 0.0) for d, f in out.iter_rows()}


def flops_by_dtype(primitives: pl.DataFrame, ops: pl.DataFrame) -> dict[str, float]:
    """Model FLOPs per step by compute dtype: conv/deconv/ip/matmul primitives (dense
    FLOPs, benchdnn's convention) plus GEMM framework ops (2*M*N*K); the dtype is the
    primitive's source data type or the op's first tensor dtype."""
    total: dict[str, float] = {}
    parts = []
    if not primitives.is_empty():
        parts.append(_grouped(primitives.filter(pl.col("driver").is_in(MODEL_FLOP_DRIVERS)),
                              pl.col("calls_per_step") * pl.col("flops_dense").fill_null(pl.col("flops"))
                              if "flops_dense" in primitives.columns
                              else pl.col("calls_per_step") * pl.col("flops")))
    if not ops.is_empty() and "family" in ops.columns:
        parts.append(_grouped(ops.filter(pl.col("family") == GEMM_OP_FAMILY),
                              pl.col("calls_per_step") * pl.col("flops")))
    for part in parts:
        for d, f in part.items():
            total[d] = total.get(d, 0.0) + f
    return {d: f for d, f in sorted(total.items()) if f > 0}


def conv_case_flops(case: Mapping[str, Any]) -> float:
    """Model FLOPs of one replayed conv call (``step_model`` case): 2*N*OC*OH*OW*IC/g*KH*KW
    forward; backward counts the weight gradient, plus the input gradient when computed."""
    out = 1
    for o in case["out"]:
        out *= int(o)
    kernel = 1
    for k in case["k"]:
        kernel *= int(k)
    forward = 2.0 * case["mb"] * case["oc"] * out * (case["ic"] // max(1, case["g"])) * kernel
    direction = str(case.get("direction", "FWD"))
    if direction.startswith("FWD"):
        return forward
    return forward * (2.0 if direction.startswith("BWD_D") else 1.0)


def native_conv_flops_by_dtype(cases: list[dict], calls: pl.DataFrame, steps: int) -> dict[str, float]:
    """Model FLOPs per step of the conv calls that ran in native ATen kernels
    (``_slow_conv2d_*``...): no oneDNN primitive counts them, yet they are the model's."""
    if calls.is_empty() or not cases or "in_situ_path" not in calls.columns:
        return {}
    by_id = {c["id"]: c for c in cases}
    out: dict[str, float] = {}
    native = calls.filter(pl.col("in_situ_path").fill_null("oneDNN") != "oneDNN")
    for cid, n in native.select("case_id", "calls").iter_rows():
        case = by_id.get(cid)
        if case is None:
            continue
        d = cfg_dtype(case.get("dtype"))
        out[d] = out.get(d, 0.0) + conv_case_flops(case) * n / max(1, steps)
    return out


def peaks_by_dtype(machine: MachineProfile, threads: int | None) -> dict[str, float]:
    """GEMM peak GFLOP/s at ``threads`` for every dtype ``machine`` has a measured peak for."""
    return {d: machine.gemm_peak_gflops(d, threads) for d in machine.native_dtypes if machine.gemm.get(d)}


def peak_for(dtype: str, peaks: Mapping[str, float]) -> float | None:
    """The ceiling ``dtype``'s FLOPs are held against: its own peak, else fp32's (emulated)."""
    return peaks.get(dtype) or peaks.get("fp32")


def time_at_peak_s(flops: Mapping[str, float], peaks: Mapping[str, float]) -> float | None:
    """Seconds the FLOPs would take at their dtypes' peaks (None without a usable peak)."""
    total = 0.0
    for d, f in flops.items():
        peak = peak_for(d, peaks)
        if not peak:
            return None
        total += f / (peak * 1e9)
    return total


def mfu(flops: Mapping[str, float], peaks: Mapping[str, float], step_ms: float | None) -> float | None:
    """(sum_d FLOPs_d / peak_d) / step time; None when the step or a peak is unknown."""
    if not step_ms or not flops:
        return None
    at_peak = time_at_peak_s(flops, peaks)
    return None if at_peak is None else at_peak / (step_ms / 1e3)


def emulated_dtypes(flops: Mapping[str, float], peaks: Mapping[str, float]) -> list[str]:
    """Dtypes with FLOPs but no peak of their own (held against fp32)."""
    return [d for d in flops if d not in peaks]


def mfu_assumption(flops: Mapping[str, float], peaks: Mapping[str, float], machine: str) -> str:
    """One line for a result's assumptions: how MFU weighs the dtypes."""
    text = ("MFU = (sum over dtypes of model FLOPs / that dtype's measured GEMM peak) / measured "
            "step time; model FLOPs are conv/deconv/ip/matmul and GEMM ops "
            "(torch.utils.flop_counter's convention)")
    emulated = emulated_dtypes(flops, peaks)
    if emulated:
        text += (f"; {', '.join(emulated)} has no native peak on {machine} (emulated): "
                 "its FLOPs are held against the fp32 peak")
    return text


def profile_from_peaks(peaks: Mapping[str, float], bandwidth_gbs: float, threads: int,
                       name: str = "the projection's machine") -> MachineProfile:
    """A minimal MachineProfile from a projection's stored peaks (for what-ifs on a Run
    whose machine profile is not at hand, e.g. in advice)."""
    return MachineProfile(
        name=name, cpu_model=name, cores=threads, native_dtypes=tuple(peaks),
        gemm={d: {threads: Measurement.of([float(p)])} for d, p in peaks.items()},
        bandwidth={threads: Measurement.of([float(bandwidth_gbs)])}, source="measured")


def format_peaks(peaks: Mapping[str, float] | None, fallback_fp32: float | None = None) -> str:
    """``fp32 201 GFLOP/s, bf16 437 GFLOP/s`` (``n/a`` when nothing is known)."""
    peaks = dict(peaks or ({} if fallback_fp32 is None else {"fp32": fallback_fp32}))
    return ", ".join(f"{d} {p:,.0f} GFLOP/s" for d, p in peaks.items()) or "n/a"


def format_flops(flops: Mapping[str, float] | None) -> str:
    """``bf16 8.1 GFLOP, fp32 0.2 GFLOP`` per step (``none counted`` when empty)."""
    return ", ".join(f"{d} {f / 1e9:,.2f} GFLOP" for d, f in (flops or {}).items()) or "none counted"


def summary_fields(flops: Mapping[str, float], peaks: Mapping[str, float],
                   step_ms: float | None) -> dict[str, Any]:
    """The ``flops_by_dtype`` / ``peak_gflops_by_dtype`` / ``mfu`` keys of a summary."""
    return {"flops_by_dtype": dict(flops), "peak_gflops_by_dtype": dict(peaks),
            "mfu": mfu(flops, peaks, step_ms)}


__all__ = ["MODEL_FLOP_DRIVERS", "conv_case_flops", "emulated_dtypes", "flops_by_dtype", "format_flops",
           "format_peaks", "mfu", "mfu_assumption", "native_conv_flops_by_dtype", "peak_for", "peaks_by_dtype",
           "profile_from_peaks", "summary_fields", "time_at_peak_s"]

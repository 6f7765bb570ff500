"""The projection's last stage: the totals per step and the assumptions behind them.

efficiency = projected kernel time / measured step time; coverage = the in-situ time that
was replayed; MFU holds each compute dtype's model FLOPs against its measured GEMM peak
(``dtypes.py``).
"""

from __future__ import annotations

from typing import Any, Mapping

import polars as pl

from ..hardware.dtypes import flops_by_dtype, mfu_assumption, peaks_by_dtype, summary_fields
from ..hardware.machine import MachineProfile
from .replay_cache import ReplayCache

ASSUMPTIONS = [
    "oneDNN primitives: replay time is oneDNN's own verbose time of the matching "
    "primitive in the replay (same clock as in situ); the PyTorch call's wall time is "
    "kept as replay_wall_ms",
    "framework ops: replay time is the wall time of the aten call at the recorded "
    "shapes; in situ is the profiler's self time",
    "items not replayed count at their in-situ time (coverage says how much was replayed)",
    "efficiency = projected kernel time / measured step time; the rest of the step is "
    "framework overhead, Python and unreplayed work",
    "roofline: compulsory bytes; FLOPs of framework ops other than GEMMs are a model",
]
NO_REPLAY = "no replay: every item counts at its in-situ time"


def _sum(df: pl.DataFrame, expr: pl.Expr) -> float:
    return float(df.select(expr.sum()).item() or 0.0) if not df.is_empty() else 0.0


def _replayed_in_situ(ptab: pl.DataFrame, otab: pl.DataFrame) -> float:
    """The in-situ ms per step of the items that were replayed (for ``coverage``)."""
    # no oneDNN rows: BF16 without native BF16
    return (_sum(ptab.filter(pl.col("replay_ms").is_not_null()) if not ptab.is_empty() else ptab,
                 pl.col("in_situ_total_ms"))
            + _sum(otab.filter(pl.col("replay_ms").is_not_null()) if not otab.is_empty() else otab,
                   pl.col("in_situ_total_ms")))


def _model_flops(ptab: pl.DataFrame, otab: pl.DataFrame,
                 native_conv_flops: Mapping[str, float] | None) -> dict[str, float]:
    flops = flops_by_dtype(ptab, otab)
    for d, f in (native_conv_flops or {}).items():  # convs no oneDNN primitive counted
        flops[d] = flops.get(d, 0.0) + f
    return flops


def _counts(ptab: pl.DataFrame, otab: pl.DataFrame) -> dict[str, int]:
    matched = ptab.filter(pl.col("same_impl").is_not_null()) if not ptab.is_empty() else ptab
    return {
        "primitives": ptab.height,
        "primitives_replayed": int(ptab["replay_ms"].is_not_null().sum()) if not ptab.is_empty() else 0,
        "same_impl": int(matched["same_impl"].sum()) if not matched.is_empty() else 0,
        "impl_checked": matched.height,
        "ops": otab.height,
        "ops_replayed": int(otab["replay_ms"].is_not_null().sum()) if not otab.is_empty() else 0,
    }


def summarize(ptab: pl.DataFrame, otab: pl.DataFrame, rows: pl.DataFrame, steps: int,
              measured_step: float | None, machine: MachineProfile, threads: int, captured_threads: int,
              native_conv_flops: Mapping[str, float] | None = None) -> tuple[dict[str, Any], list[str]]:
    """The projection's summary (per step) and its assumptions."""
    in_situ_kernel = float(rows["in_situ"].sum()) / steps
    projected = float(rows["projected"].sum()) / steps
    attainable = float(rows["attainable"].sum()) / steps
    flops = _model_flops(ptab, otab, native_conv_flops)
    peaks = peaks_by_dtype(machine, threads)
    summary = {
        "measured_step_ms": measured_step,
        "in_situ_kernel_ms": in_situ_kernel,
        "projected_kernel_ms": projected,
        "efficiency": projected / measured_step if measured_step else None,
        "kernel_efficiency": projected / in_situ_kernel if in_situ_kernel else None,
        "attainable_step_ms": attainable,
        "roofline_efficiency": attainable / measured_step if measured_step else None,
        "framework_ms": (measured_step - in_situ_kernel) if measured_step else None,
        "model_flops_per_step": sum(flops.values()),
        **summary_fields(flops, peaks, measured_step),  # flops/peak_gflops_by_dtype, mfu
        "coverage": _replayed_in_situ(ptab, otab) / in_situ_kernel if in_situ_kernel else None,
        "threads": threads,
        "captured_threads": captured_threads,
        "steps": steps,
        **_counts(ptab, otab),
        "machine": machine.name,
        "gemm_peak_gflops": machine.gemm_peak_gflops("fp32", threads),
        "bandwidth_gbs": machine.bandwidth_at(threads),
    }
    assumptions = [*ASSUMPTIONS, mfu_assumption(flops, peaks, machine.name)]
    if threads != captured_threads:
        assumptions.append(f"replayed at {threads} threads; the Run was captured at {captured_threads}")
    assumptions += machine.assumptions
    return summary, assumptions


def note_replay(summary: dict[str, Any], assumptions: list[str], *, replayed: bool, replay_dtype: str | None,
                cold: ReplayCache | None) -> None:
    """Say in ``summary`` and ``assumptions`` how the replay ran: at all, in which dtype, how cold."""
    summary["replayed"] = bool(replayed)
    if replay_dtype:
        summary["replay_dtype"] = replay_dtype
        assumptions.append(f"conv calls and GEMM ops replayed in {replay_dtype} (as autocast runs them); "
                           "other ops replayed as captured")
    if cold is not None:
        summary["replay_cache"] = cold.to_dict()
        assumptions.append(f"cold replays evict {cold.bytes / 2**20:.0f} MiB before each call: {cold.detail}")


__all__ = ["NO_REPLAY", "note_replay", "summarize"]

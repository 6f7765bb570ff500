"""Headroom after optimize: what holds the optimized step below the GEMM peak.

MFU says how far the step is from its dtypes' GEMM peaks, not why. This stage profiles a
few steps of the optimized setup (``torch.profiler``, CPU, as capture does; after one
untimed step) and splits them by op family (``op_families.py``): the GEMM/conv part with
its own efficiency (the step's model FLOPs at the measured peaks over the time GEMM/conv
took, ``hardware.dtypes.mfu``), and the rest (batch norm, elementwise, copies, the
optimizer, overhead ...) in ms per step and share. It runs in this process: a launch
environment that won (allocator, threads) acts only at process start and is not in it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import polars as pl
import torch

from ..tables import OPTIMIZE_HEADROOM
from ..train_step import TrainStep
from .op_families import DESCRIPTIONS, GEMM, LOSS_REGION, STEP_REGION, family_split


@dataclass
class Headroom:
    """The optimized step split by op family (the ``optimize_headroom`` table) and the
    GEMM/conv part's efficiency against the measured peaks."""

    families: pl.DataFrame
    steps: int
    step_ms: float  # mean profiled step, under the profiler
    gemm_efficiency: float | None = None
    notes: list[str] = field(default_factory=list)

    def _family_ms(self, family: str) -> float:
        row = self.families.filter(pl.col("family") == family)
        return float(row["ms_per_step"].sum()) if row.height else 0.0

    @property
    def gemm_ms(self) -> float:
        return self._family_ms(GEMM)

    @property
    def outside_gemm_ms(self) -> float:
        return float(self.families["ms_per_step"].sum()) - self.gemm_ms

    def weigh(self, flops: Mapping[str, float] | None, peaks: Mapping[str, float] | None,
              counted: str = "model FLOPs") -> None:
        """The GEMM/conv part's efficiency from the step's model ``flops`` per dtype and the
        ``peaks`` (GFLOP/s); without either, a note that says so (``counted``: what the FLOPs were)."""
        from ..hardware.dtypes import mfu

        if flops and peaks:
            self.gemm_efficiency = mfu(flops, peaks, self.gemm_ms)
        else:
            self.notes.append(f"no GEMM efficiency: {counted} or the machine's GEMM peaks were not measured")

    def table(self) -> pl.DataFrame:
        """One row per family with time (the Run's ``optimize_headroom`` table)."""
        rows = [{**r, "description": DESCRIPTIONS.get(r["family"]),
                 "efficiency": self.gemm_efficiency if r["family"] == GEMM else None}
                for r in self.families.iter_rows(named=True)]
        return OPTIMIZE_HEADROOM.frame(rows)

    def to_dict(self) -> dict[str, Any]:
        share = (lambda v: 100.0 * v / self.step_ms) if self.step_ms else (lambda v: None)
        return {
            "steps_profiled": self.steps,
            "step_ms": self.step_ms,
            "gemm_ms": self.gemm_ms,
            "gemm_share_pct": share(self.gemm_ms),
            "gemm_efficiency": self.gemm_efficiency,
            "outside_gemm_ms": self.outside_gemm_ms,
            "outside_gemm_pct": share(self.outside_gemm_ms),
            "families": [{"family": r["family"], "ms_per_step": r["ms_per_step"], "share_pct": r["share_pct"],
                          "top_ops": r["top_ops"]} for r in self.families.iter_rows(named=True)],
            "notes": list(self.notes),
        }


def profile_events(setup: TrainStep, steps: int) -> pl.DataFrame:
    """One untimed step, then ``steps`` steps under ``torch.profiler`` (CPU), each in a
    ``profilednn::step`` region with the loss in ``profilednn::loss``. One row per event
    (``op``, ``self_ms``, ``dur_ms``, ``parent``: row index or -1), parents first."""
    from ..capture.stream import quiet_profiler_noise

    setup.run()

    def phase(name: str) -> Any:
        return torch.profiler.record_function(LOSS_REGION if name == "loss" else f"profilednn::{name}")

    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    with quiet_profiler_noise():
        prof.start()
    try:
        for _ in range(steps):
            with torch.profiler.record_function(STEP_REGION):
                setup.run(phase=phase)
    finally:
        with quiet_profiler_noise():
            prof.stop()
    return events_frame(prof)


def events_frame(prof: torch.profiler.profile) -> pl.DataFrame:
    """A stopped profiler's CPU events, one row each (``op``, ``self_ms``, ``dur_ms``,
    ``parent``: row index or -1), parents first: ``op_families.family_split``'s input."""
    events = [e for e in prof.events() if not e.is_async and e.name != "[memory]"]
    events.sort(key=lambda e: (e.time_range.start, -(e.time_range.end - e.time_range.start)))
    index = {id(e): i for i, e in enumerate(events)}
    rows = [(e.name, e.self_cpu_time_total / 1e3, (e.time_range.end - e.time_range.start) / 1e3,
             index.get(id(e.cpu_parent), -1) if e.cpu_parent is not None else -1) for e in events]
    return pl.DataFrame(rows, schema={"op": pl.Utf8, "self_ms": pl.Float64, "dur_ms": pl.Float64,
                                      "parent": pl.Int64}, orient="row")


def measure_headroom(
    setup: TrainStep,
    steps: int,
    flops: Mapping[str, float] | None,
    peaks: Mapping[str, float] | None,
    say: Callable[[str], None],
    launch_env: Mapping[str, str] | None = None,
) -> tuple[Headroom | None, str | None]:
    """Profile ``steps`` steps of ``setup`` and split them by op family; the GEMM/conv
    part's efficiency from the step's model ``flops`` per dtype and the ``peaks`` (GFLOP/s).
    Returns (headroom, None) or (None, why it could not be measured)."""
    say(f"headroom: {steps} steps of the optimized setup under torch.profiler (time by op family)")
    try:
        events = profile_events(setup, steps)
        families, step_ms, n = family_split(events)
    except (RuntimeError, ValueError) as exc:
        return None, f"no headroom split: profiling the optimized step failed ({type(exc).__name__}: {exc})"
    headroom = Headroom(families, n, step_ms)
    headroom.weigh(flops, peaks)
    headroom.notes.append(f"ms per step under torch.profiler ({step_ms:.1f} ms a step there), mean of {n} steps; "
                          "each event's self time counts once")
    if launch_env:
        headroom.notes.append("profiled in this process, without the launch environment ("
                              + " ".join(f"{k}={v}" for k, v in launch_env.items()) + ")")
    return headroom, None


__all__ = ["Headroom", "events_frame", "measure_headroom", "profile_events"]

"""Prove a what-if against a measured run: profile at A, project to B, profile at B.

For a Run of a built-in workload captured at A (its thread count and dtype), this
projects its own step at A (the step model's self-check), predicts the step at B
(threads by replay; BF16 by the roofline what-if, only on a CPU with native BF16), then
profiles the same workload at B and compares predicted with measured, per phase and
per part of the step model. Steps are means over each Run's measured steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import polars as pl

from ..errors import InputError
from ..run import Run, load_run
from ..tables import STEPS
from ..hardware.machine import get_machine
from .project_replay import run_threads
from .projector import Projection, project
from .step_model import by_part, by_phase

ProgressFn = Callable[[str], None]


@dataclass
class Validation:
    """Predicted vs measured at B: per phase and per part, and the step totals."""

    by_phase: pl.DataFrame
    by_part: pl.DataFrame
    summary: dict[str, Any]
    assumptions: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"summary": self.summary, "by_phase": self.by_phase.to_dicts(),
                "by_part": self.by_part.to_dicts(), "assumptions": self.assumptions}


def _err(pred: float | None, meas: float | None) -> float | None:
    return None if pred is None or not meas else (pred - meas) / meas


def _compare(pred: pl.DataFrame, meas: pl.DataFrame, key: str) -> pl.DataFrame:
    """Join predicted (projected_ms) and measured (in_situ_ms of B's own model) on ``key``."""
    p = pred.select(key, pl.col("in_situ_ms").alias("measured_a_ms"),
                    pl.col("projected_ms").alias("predicted_b_ms"))
    m = meas.select(key, pl.col("in_situ_ms").alias("measured_b_ms"))
    return (p.join(m, on=key, how="full", coalesce=True)
            .with_columns(((pl.col("predicted_b_ms") - pl.col("measured_b_ms"))
                           / pl.col("measured_b_ms")).alias("error")))


def _mean_step(run: Run) -> float | None:
    steps = run.table(STEPS) if run.has_table(STEPS) else pl.DataFrame()
    return float(steps["time_ms"].mean()) if not steps.is_empty() else None


def validate(run: Run | Path | str, *, threads: int | None = None, dtype: str | None = None,
             runs_dir: Path | str = "runs", steps: int | None = None,
             budget_s: float = 0.25, progress: ProgressFn | None = None) -> Validation:
    """Profile ``run``'s workload at B (``threads`` and/or ``dtype``) and check the projection.

    Raises InputError when the Run is not of a built-in workload (nothing to re-run), when
    B equals A, or for a reduced dtype that does not pay on this CPU (``require_faster_dtype``).
    """
    from ..capture import profile_builtin
    from ..workloads.zoo import get_spec
    from .what_if import require_faster_dtype, whatif

    say = progress or (lambda _msg: None)
    run = run if isinstance(run, Run) else load_run(run)
    wl = run.workload
    if wl.get("kind") != "builtin" or not wl.get("name"):
        raise InputError(f"Run {run.path} is not of a built-in workload: --validate re-runs the "
                         "workload at the target, so profile a built-in model (or compare two "
                         "Runs of your script with `profilednn compare`)")
    cfg = dict(wl.get("config") or {})
    src_threads = run_threads(run)
    src_dtype = cfg.get("dtype", "fp32")
    dst_threads = int(threads or src_threads)
    dst_dtype = dtype or src_dtype
    if dst_threads == src_threads and dst_dtype == src_dtype:
        raise InputError("the target equals the Run (same threads and dtype): give --threads "
                         "or --dtype to validate a what-if")
    machine = get_machine()
    if dst_dtype != src_dtype:
        require_faster_dtype(machine, dst_dtype)
    spec = get_spec(wl["name"])
    knobs = {k: cfg[k] for k in spec.knobs if k in cfg}
    n_steps = int(steps or run.manifest.get("steps") or 2)

    say(f"projecting the Run's own step at {src_threads} thread(s)")
    own = project(run, threads=src_threads, budget_s=budget_s)
    say(f"projecting to {dst_threads} thread(s), {dst_dtype}")
    to_b: Projection = own if dst_threads == src_threads else project(
        run, threads=dst_threads, budget_s=budget_s, write=False)
    predicted_step = to_b.summary.get("projected_step_ms")
    pred_parts = to_b.step
    assumptions = list(to_b.assumptions)
    if dst_dtype != src_dtype:
        say(f"replaying its conv calls and GEMM ops in {dst_dtype} at {dst_threads} thread(s)")
        replayed = project(run, threads=dst_threads, budget_s=budget_s, write=False, replay_dtype=dst_dtype)
        w = whatif(to_b, dtype=dst_dtype, replayed=replayed)
        predicted_step = w.summary.get("projected_step_ms")
        factors = w.summary.get("step_part_factors") or {}
        pred_parts = pred_parts.with_columns(
            pl.col("projected_ms") * pl.col("part").replace_strict(factors, default=1.0,
                                                                    return_dtype=pl.Float64))
        assumptions += w.assumptions
    say(f"profiling {wl['name']} at {dst_threads} thread(s), {dst_dtype}")
    run_b = profile_builtin(wl["name"], runs_dir, steps=n_steps, warmup=1, threads=dst_threads,
                            dtype=dst_dtype, channels_last=bool(cfg.get("channels_last")),
                            seed=int(cfg.get("seed", 0)), **knobs)
    meas_b = project(run_b, replay=False, write=False)
    phases = _compare(by_phase(pred_parts), by_phase(meas_b.step), "phase")
    parts = _compare(by_part(pred_parts), by_part(meas_b.step), "part")
    measured_a, measured_b = _mean_step(run), _mean_step(run_b)
    own_step = own.summary.get("projected_step_ms")
    summary = {
        "workload": wl["name"], "knobs": knobs, "run_a": str(run.path), "run_b": str(run_b.path),
        "machine": machine.name,
        "a": {"threads": src_threads, "dtype": src_dtype},
        "b": {"threads": dst_threads, "dtype": dst_dtype},
        "measured_a_step_ms": measured_a,
        "own_projected_step_ms": own_step,
        "own_error": _err(own_step, measured_a),
        "predicted_b_step_ms": predicted_step,
        "measured_b_step_ms": measured_b,
        "error": _err(predicted_step, measured_b),
        "native_conv_measured_b_ms": meas_b.summary.get("native_conv_in_situ_ms"),
        "native_conv_predicted_b_ms": to_b.summary.get("native_conv_projected_ms"),
        "conv_calls_switching_path": to_b.summary.get("conv_calls_switching_path"),
    }
    return Validation(phases, parts, summary, assumptions)


__all__ = ["Validation", "validate"]

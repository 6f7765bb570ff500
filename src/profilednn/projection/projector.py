"""Project a Run: replay its primitives and ops alone, weigh by calls, compare with the step.

projected kernel time = sum over unique primitives/ops of calls x replay time (items that
could not be replayed count at their in-situ time, and ``coverage`` says how much was
replayed); efficiency = projected kernel time / measured step time, for the step and per
driver, layer and phase. The roofline gives each primitive's attainable time from the
machine's measured peaks, and the step's ceiling; MFU holds each compute dtype's model
FLOPs against that dtype's measured GEMM peak (``dtypes.py``).

``project`` runs the stages in order, one module each: cases (``project_cases.py``: what
to replay) -> replay (``project_replay.py``) -> tables (``project_tables.py``: per
primitive, per op, breakdown) -> summary (``project_summary.py``) -> step model
(``project_step.py``). This module holds the ``Projection`` they make and its storage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from ..errors import RunError
from ..run import Run, load_run
from ..tables import (
    PROJECTION_BREAKDOWN,
    PROJECTION_CONV_CALLS,
    PROJECTION_OPS,
    PROJECTION_PRIMITIVES,
    PROJECTION_STEP,
    STEPS,
)
from ..hardware.dtypes import native_conv_flops_by_dtype
from ..hardware.drift import STORED, MachineCheck, Remeasure, checked_machine, given_machine, stored_machine
from ..hardware.machine import MachineProfile
from ..hardware.probe import Probe, ProbeFn
from .project_cases import gather_cases, in_dtype, replay_inputs
from .project_replay import no_replay, replay_all, replay_threads
from .project_step import model_step
from .project_summary import NO_REPLAY, note_replay, summarize
from .project_tables import attributed_rows, breakdown_table, nesting, op_table, primitive_table
from .replay import ProgressFn

TABLE_PRIMITIVES = PROJECTION_PRIMITIVES.name  # the catalogue's names (profilednn.tables)
TABLE_OPS = PROJECTION_OPS.name
TABLE_BREAKDOWN = PROJECTION_BREAKDOWN.name
TABLE_STEP = PROJECTION_STEP.name  # the step model (step_model.py), per phase and part
TABLE_CONV_CALLS = PROJECTION_CONV_CALLS.name
MANIFEST_KEY = "kernel_projection"  # "projection" is the distributed job's key


@dataclass
class Projection:
    """A Run's projection: per-primitive and per-op tables, breakdowns and totals."""

    primitives: pl.DataFrame
    ops: pl.DataFrame
    breakdown: pl.DataFrame
    summary: dict[str, Any]
    assumptions: list[str] = field(default_factory=list)
    run_path: Path | None = None
    step: pl.DataFrame = field(default_factory=pl.DataFrame)  # step_model.step_parts
    conv_calls: pl.DataFrame = field(default_factory=pl.DataFrame)
    # the machine its figures were computed with and how it was checked (drift.MachineCheck.record);
    # None for a projection stored before Runs kept it
    machine: dict[str, Any] | None = None
    # the full profile behind ``machine`` when this process computed the projection (not stored)
    machine_used: MachineProfile | None = field(default=None, repr=False, compare=False)

    @property
    def machine_profile(self) -> MachineProfile | None:
        """The profile this projection's peaks and bandwidth came from, as stored in the Run."""
        return stored_machine(self.machine)

    @property
    def by_driver(self) -> pl.DataFrame:
        return self._level("driver")

    @property
    def by_layer(self) -> pl.DataFrame:
        return self._level("layer")

    @property
    def by_phase(self) -> pl.DataFrame:
        return self._level("phase")

    def _level(self, level: str) -> pl.DataFrame:
        return self.breakdown.filter(pl.col("level") == level).drop("level").sort(
            "in_situ_ms", descending=True)

    def to_dict(self) -> dict[str, Any]:
        return {
            "run": str(self.run_path) if self.run_path else None,
            "summary": self.summary,
            "assumptions": self.assumptions,
            "primitives": self.primitives.to_dicts(),
            "ops": self.ops.to_dicts(),
            "by_driver": self.by_driver.to_dicts(),
            "by_layer": self.by_layer.to_dicts(),
            "by_phase": self.by_phase.to_dicts(),
            "step": self.step.to_dicts(),
            "conv_calls": self.conv_calls.to_dicts(),
            "machine": self.machine,
        }

    def save(self, run: Run) -> None:
        """Write the tables into the Run and the totals into its manifest."""
        run.write_table(PROJECTION_PRIMITIVES, self.primitives)
        run.write_table(PROJECTION_OPS, self.ops)
        run.write_table(PROJECTION_BREAKDOWN, self.breakdown)
        for name, tab in ((PROJECTION_STEP, self.step), (PROJECTION_CONV_CALLS, self.conv_calls)):
            if not tab.is_empty():
                run.write_table(name, tab)
        meta = {"summary": self.summary, "assumptions": self.assumptions}
        run.update(**{MANIFEST_KEY: {**meta, **({"machine": self.machine} if self.machine else {})}})


def load_projection(run: Run | Path | str) -> Projection | None:
    """The projection stored in a Run (None when the Run has not been projected)."""
    run = run if isinstance(run, Run) else load_run(run)
    meta = run.manifest.get(MANIFEST_KEY)
    if not meta or not run.has_table(TABLE_PRIMITIVES):
        return None
    ops = run.table(TABLE_OPS) if run.has_table(TABLE_OPS) else pl.DataFrame()
    breakdown = run.table(TABLE_BREAKDOWN) if run.has_table(TABLE_BREAKDOWN) else pl.DataFrame(
        schema={"level": pl.Utf8, "name": pl.Utf8, "in_situ_ms": pl.Float64})
    extra = {k: run.table(t) for k, t in (("step", TABLE_STEP), ("conv_calls", TABLE_CONV_CALLS))
             if run.has_table(t)}
    return Projection(run.table(TABLE_PRIMITIVES), ops, breakdown, dict(meta.get("summary") or {}),
                      list(meta.get("assumptions") or []), run.path, **extra, machine=meta.get("machine") or None)


def step_count(run: Run) -> tuple[int, float | None]:
    """The Run's measured steps and its median step time (ms; None without a steps table)."""
    steps = run.table(STEPS) if run.has_table(STEPS) else pl.DataFrame()
    n = int(run.manifest.get("steps") or steps.height or 1)
    measured = float(steps["time_ms"].median()) if not steps.is_empty() else None
    return max(n, 1), measured


def project(run: Run | Path | str, threads: int | None = None,
            machine: MachineProfile | None = None, progress: ProgressFn | None = None, *,
            budget_s: float = 0.25, replay_ops: bool = True, replay: bool = True,
            write: bool = True, step_model: bool = True, replay_dtype: str | None = None,
            probe: ProbeFn | None = None, remeasure: Remeasure | None = None) -> Projection:
    """Replay ``run``'s primitives and ops alone and project its step (see module doc).

    ``threads``: replay at this thread count (default: the Run's); ``machine``: the
    profile whose peaks the roofline and MFU use (default: this machine, measured and
    cached). ``replay=False`` measures nothing: every item counts at its in-situ time
    (roofline, MFU and what-ifs still work, e.g. for a Run from another machine).
    ``write``: store the tables in the Run (its HTML report then shows them).
    ``step_model``: also replay each PyTorch conv call whole and predict the step
    (``projected_step_ms``, see ``step_model.py``). Without ``machine``, the cached profile is
    checked by a probe first (``hardware/drift.py``; ``probe`` and ``remeasure`` inject them)
    and re-measured at ``threads`` when the machine drifted; ``replay=False`` re-uses the machine a previous projection stored in the Run. ``replay_dtype`` ("bf16"): replay the
    conv calls and GEMM ops in that dtype instead of the captured one -- a measured dtype
    what-if on this machine (``whatif(..., replayed=...)``); the rest replays as captured.

    The stages: cases (``project_cases``) -> replay (``project_replay``) -> tables
    (``project_tables``) -> summary (``project_summary``) -> step model (``project_step``).
    """
    run = run if isinstance(run, Run) else load_run(run)
    prims, ops = replay_inputs(run, replay_ops)
    threads, captured = replay_threads(run, threads)
    check = machine_for(run, machine, threads, replay, probe, remeasure)
    machine = check.machine
    steps, measured_step = step_count(run)
    cases = gather_cases(run, prims, ops, step_model=step_model, replay_dtype=replay_dtype)
    replays = replay_all(run, cases, threads, captured, machine, steps, calibrate=step_model,
                         progress=progress, budget_s=budget_s) if replay else no_replay(threads)

    ptab = primitive_table(cases.unique, replays.result, steps, machine, threads)
    otab = op_table(cases.uops, replays.result, steps, machine, threads)
    nested, out = nesting(run, otab)
    rows = attributed_rows(cases.prims, ptab, cases.ops, otab, out)
    breakdown = breakdown_table(rows, steps)

    summary, assumptions = summarize(ptab, otab, rows, steps, measured_step, machine, threads, captured,
                                     native_conv_flops_by_dtype(cases.conv_cases, cases.calls, steps))
    note_replay(summary, assumptions, replayed=replay, replay_dtype=replay_dtype, cold=replays.cold)
    note_machine(summary, assumptions, check)
    step, calls = pl.DataFrame(), cases.calls
    if step_model and run.has_table(STEPS):
        model = model_step(run, cases, replays, ptab, otab, nested, out, steps, threads, captured)
        step, calls, otab = model.step, model.calls, model.ops
        summary.update(model.summary)
        assumptions += model.assumptions
    if not replay:
        assumptions.insert(0, NO_REPLAY)
    proj = Projection(ptab, otab, breakdown, summary, assumptions, run.path, step, calls, check.record(), machine)
    if write:
        proj.save(run)
    return proj


def machine_for(run: Run, machine: MachineProfile | None, threads: int, replay: bool,
                probe: ProbeFn | None, remeasure: Remeasure | None = None) -> MachineCheck:
    """The machine a projection's figures use: the one given; without a replay, the one a
    previous projection stored in the Run (nothing is measured now); else the cached
    profile, checked by a probe at ``threads``."""
    if machine is not None:
        return given_machine(machine, threads)
    if not replay:
        previous = (run.manifest.get(MANIFEST_KEY) or {}).get("machine")
        stored = stored_machine(previous)
        if stored is not None:
            probe = Probe.from_dict(previous["probe"]) if previous.get("probe") else None
            return MachineCheck(stored, STORED, threads, probe, dict(previous.get("ratios") or {}),
                                dict(previous.get("tolerance") or {}), previous.get("note"))
    return checked_machine(threads, probe=probe, remeasure=remeasure)


def note_machine(summary: dict[str, Any], assumptions: list[str], check: MachineCheck) -> None:
    """Say in ``summary`` and ``assumptions`` which machine the figures were computed with."""
    summary["machine_measured"] = check.machine.measured
    summary["machine_check"] = check.verdict
    if check.verdict == STORED:
        assumptions.append(f"peaks and bandwidth as stored in the Run by its projection ({check.machine.name}, "
                           f"measured {check.machine.measured or 'at an unknown time'})")
    if check.note:
        summary["machine_note"] = check.note
        assumptions.insert(0, check.note)


def require_projection(run: Run) -> Projection:
    proj = load_projection(run)
    if proj is None:
        raise RunError(f"Run {run.path} has no projection; run `profilednn project {run.path}` first")
    return proj


__all__ = ["Projection", "in_dtype", "load_projection", "machine_for", "note_machine", "project", "require_projection", "step_count"]

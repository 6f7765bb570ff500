"""The projection's fourth stage: the step model (``step_model.py``) on the replays.

Each PyTorch conv call replayed whole, native ops calibrated where the replay ran at
another thread count than the Run, and the step predicted phase by phase and part by part.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from ..run import Run
from ..tables import STEPS
from .nesting import per_unique_op
from .project_cases import ProjectionCases
from .project_replay import Replays
from .project_tables import OP_KEY
from .step_model import (CALIBRATION_BOUNDS, attach_conv_replay, calibrate_ops, native_calibration, step_parts,
                         step_summary)


@dataclass
class StepModel:
    """The step model's parts table, the conv calls with their replays, the op table with
    the calls other items hold, and what it adds to the summary and the assumptions."""

    step: pl.DataFrame
    calls: pl.DataFrame
    ops: pl.DataFrame
    summary: dict[str, Any] = field(default_factory=dict)
    assumptions: list[str] = field(default_factory=list)


def _calibration_note(calibration: pl.DataFrame, threads: int, captured: int) -> str:
    factors = ", ".join(
        f"{f} {x:.2f}" + ("" if used else f" not applied: outside {CALIBRATION_BOUNDS[0]}-"
                                           f"{CALIBRATION_BOUNDS[1]}, a disturbed replay")
        for f, x, used in calibration.select("family", "factor", "used").iter_rows())
    return (f"native kernels at {threads} thread(s): cold replay x in-situ/replay ratio per "
            f"op family measured at the Run's {captured} ({factors}), assumed not to depend on "
            "the thread count")


def model_step(run: Run, cases: ProjectionCases, replays: Replays, ptab: pl.DataFrame,
               otab: pl.DataFrame, nested: pl.DataFrame | None, out: pl.DataFrame | None, steps: int,
               threads: int, captured: int) -> StepModel:
    """Predict the Run's step from the replays (in-situ times where nothing was replayed)."""
    calls = attach_conv_replay(cases.calls, replays.result if replays.measured else None, steps)
    if out is not None:
        otab = otab.join(per_unique_op(out, steps), on=OP_KEY, how="left", nulls_equal=True)
    at_captured = replays.at_captured
    calibration = native_calibration(otab, {c["id"]: at_captured.wall_ms(c["id"]) for c in cases.op_cases}) \
        if at_captured is not None else pl.DataFrame()
    step = step_parts(run.table(STEPS), cases.all_ops, cases.prims, ptab,
                      calibrate_ops(otab, calibration), calls, nested)
    model = StepModel(step, calls, otab, step_summary(step, calls))
    if not calibration.is_empty():
        model.summary["native_calibration"] = calibration.to_dicts()
        model.assumptions.append(_calibration_note(calibration, threads, captured))
    model.assumptions.append(
        f"projected_step_ms: the step model (mean over {steps} step(s)): kernel parts "
        f"replayed at {threads} thread(s), other ops and Python gaps as measured")
    return model


__all__ = ["StepModel", "model_step"]

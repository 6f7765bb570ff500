"""The largest batch that fits a memory budget: predicted, then confirmed by a run.

Prediction: the predicted peak (``footprint.predict_peak_bytes``, structure only) at two
small batch sizes gives a line, fixed bytes + bytes per item; the budget's batch is where
the line meets the budget. Confirmation: one warm-up step and one measured step at that
batch (``peak.measure_step_peak``: tensor bytes on a CPU, ``max_memory_allocated`` on an
accelerator). The next guess follows the line through the measured point and the fixed
part: down when the batch did not fit, up when it fitted with room to spare; at most
``max_attempts`` runs. The answer is the largest batch measured to fit.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import polars as pl
import torch

from ..errors import InputError
from ..tables import MEMORY_BUDGET
from ..train_step import TrainStep
from .footprint import predict_peak_bytes
from .peak import measure_step_peak
from .training import build_on_device
from .units import format_bytes

ATTEMPT_SCHEMA = MEMORY_BUDGET.schema  # the catalogue's (profilednn.tables)


@dataclass
class BudgetResult:
    """``predicted_batch``: from the line; ``confirmed_batch``: the largest batch measured to
    fit (None when none was confirmed); ``attempts``: every batch predicted or run."""

    budget_bytes: int
    fixed_bytes: int
    bytes_per_item: int
    predicted_batch: int
    confirmed_batch: int | None
    attempts: pl.DataFrame = field(repr=False)

    def describe(self) -> str:
        text = (f"budget {format_bytes(self.budget_bytes)}: predicted batch {self.predicted_batch} "
                f"(fixed {format_bytes(self.fixed_bytes)} + {format_bytes(self.bytes_per_item)}/item)")
        if self.confirmed_batch is not None:
            text += f"; confirmed batch {self.confirmed_batch} by a run"
        return text


def _build(name: str, batch: int, device: str, knobs: dict[str, Any]) -> TrainStep:
    return build_on_device(name, device=device, **{**knobs, "batch_size": batch})


def _try_batch(name: str, batch: int, device: str, knobs: dict[str, Any]) -> tuple[int | None, int]:
    """(measured peak or None when the accelerator ran out of memory, predicted peak)."""
    state = _build(name, batch, device, knobs)
    predicted_peak = predict_peak_bytes(state)
    try:
        measured: int | None = _measured_peak(state)
    except torch.OutOfMemoryError:
        measured = None
    del state
    gc.collect()
    if device != "cpu":
        torch.accelerator.empty_cache()
    return measured, predicted_peak


def _measured_peak(state: TrainStep) -> int:
    state.run()  # creates the optimizer's state: the measured step is a steady one
    state.optimizer.zero_grad(set_to_none=True)
    inputs, targets = state.batches[0]
    m = measure_step_peak(state.run, state.model, live=(state.model, state.optimizer, (inputs, targets)),
                          device=state.device)
    return m.peak_bytes


def fit_batch_to_budget(
    name: str,
    budget_bytes: int,
    *,
    device: str = "cpu",
    confirm: bool = True,
    probe_batches: tuple[int, int] = (2, 4),
    max_attempts: int = 4,
    progress: Callable[[str], None] | None = None,
    **knobs: Any,
) -> BudgetResult:
    """The largest batch of workload ``name`` whose training step fits ``budget_bytes``."""
    knobs = {k: v for k, v in knobs.items() if k != "batch_size"}
    rows: list[dict[str, Any]] = []
    b1, b2 = probe_batches
    p1 = predict_peak_bytes(_build(name, b1, device, knobs))
    p2 = predict_peak_bytes(_build(name, b2, device, knobs))
    per_item = max(1, (p2 - p1) // (b2 - b1))
    fixed = p1 - per_item * b1
    for b, p in ((b1, p1), (b2, p2)):
        rows.append({"batch_size": b, "stage": "probe", "predicted_peak_bytes": p,
                     "measured_peak_bytes": None, "budget_bytes": budget_bytes, "fits": p <= budget_bytes})
    predicted = (budget_bytes - fixed) // per_item
    if predicted < 1:
        raise InputError(f"{name} does not fit {format_bytes(budget_bytes)} even at batch 1: its fixed "
                         f"part alone (weights, gradients, optimizer state) is about {format_bytes(fixed)}")
    result = BudgetResult(budget_bytes, fixed, per_item, int(predicted), None, pl.DataFrame())
    batch: int | None = int(predicted)
    tried: set[int] = set()
    while confirm and batch is not None and batch >= 1 and batch not in tried and len(tried) < max_attempts:
        tried.add(batch)
        if progress is not None:
            progress(f"confirming batch {batch}")
        measured, predicted_peak = _try_batch(name, batch, device, knobs)
        fits = measured is not None and measured <= budget_bytes
        rows.append({"batch_size": batch, "stage": "confirm", "predicted_peak_bytes": predicted_peak,
                     "measured_peak_bytes": measured, "budget_bytes": budget_bytes, "fits": fits})
        if fits and (result.confirmed_batch is None or batch > result.confirmed_batch):
            result.confirmed_batch = batch
        # Next guess along the measured line through (batch, measured) and the fixed part.
        if measured is None:  # out of memory on the accelerator
            guess = int(batch * 0.8)
        else:
            guess = int(batch * (budget_bytes - fixed) / max(1, measured - fixed))
        if fits:
            batch = guess if guess > batch else None  # grow only
        else:
            batch = min(batch - 1, guess)
        if batch is not None and result.confirmed_batch is not None and batch <= result.confirmed_batch:
            break
    result.attempts = pl.DataFrame(rows, schema=ATTEMPT_SCHEMA)
    return result


__all__ = ["BudgetResult", "fit_batch_to_budget"]

"""``TrainStep``: the one training step every job runs, in one order, reading the loss one way.

    zero_grad(set_to_none=True)                 # "optimizer": frees last step's gradients first
    inputs, targets = batch (on the device)     # "data"
    outputs = forward(inputs)                   # "forward": channels_last / BF16 autocast here
    loss = loss_fn(outputs, targets)            # "loss": always fp32
    loss.backward()                             # "backward"
    optimizer.step()                            # "optimizer"
    loss value = float(loss.detach())

Workloads build it (``Workload.as_train_step``); capture, optimize, memory, distributed
and the pipeline's plain reference run it and add their observation through hooks:
``phase(name)`` wraps the data and loss phases (a profiler sees forward, backward and the
optimizer through module, autograd and optimizer hooks, but not these two),
``around_forward`` wraps forward and loss (memory's offloading and counters),
``before_update`` runs between backward and the update (optimize reads gradients there).
Every step also records when each phase ended (``StepResult.marks``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ContextManager

import torch
from torch import nn

from .tables import PHASES

PhaseHook = Callable[[str], ContextManager[Any]]


def forward_with_policy(model: nn.Module, inputs: Any, channels_last: bool,
                        autocast_dtype: torch.dtype | None) -> Any:
    """``model(inputs)`` with 4-D inputs in channels_last when asked, and under CPU autocast
    to ``autocast_dtype`` when set. Under autocast the floating outputs are cast back to
    fp32, so the loss is never computed in BF16 (reductions lose accuracy there)."""
    if channels_last and isinstance(inputs, torch.Tensor) and inputs.dim() == 4:
        inputs = inputs.contiguous(memory_format=torch.channels_last)
    if autocast_dtype is None:
        return model(inputs)
    with torch.autocast("cpu", dtype=autocast_dtype):
        outputs = model(inputs)
    return floating_to_fp32(outputs)


def floating_to_fp32(outputs: Any) -> Any:
    """Cast every floating tensor in ``outputs`` (a tensor, dict, list or tuple) to fp32."""
    if isinstance(outputs, torch.Tensor):
        return outputs.float() if outputs.is_floating_point() else outputs
    if isinstance(outputs, Mapping):
        return {key: floating_to_fp32(value) for key, value in outputs.items()}
    if isinstance(outputs, (list, tuple)):
        return type(outputs)(floating_to_fp32(value) for value in outputs)
    return outputs


def to_device(value: Any, device: torch.device) -> Any:
    """Tensors in ``value`` (nested lists/tuples/dicts) moved to ``device``."""
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_device(v, device) for v in value)
    return value


@dataclass(frozen=True)
class StepMarks:
    """``time.perf_counter()`` when the step began and when each part of it ended."""

    start: float
    zeroed: float
    data: float
    forward: float
    loss: float
    backward: float
    end: float

    def phase_ms(self) -> dict[str, float]:
        """Milliseconds per phase (``PHASES``); zero_grad counts as optimizer time."""
        return {
            "data_ms": (self.data - self.zeroed) * 1e3,
            "forward_ms": (self.forward - self.data) * 1e3,
            "loss_ms": (self.loss - self.forward) * 1e3,
            "backward_ms": (self.backward - self.loss) * 1e3,
            "optimizer_ms": (self.end - self.backward + self.zeroed - self.start) * 1e3,
            "other_ms": 0.0,
        }

    @property
    def total_ms(self) -> float:
        return (self.end - self.start) * 1e3


@dataclass(frozen=True)
class StepResult:
    """One step's loss (a Python float, read once with ``float(loss.detach())``) and marks."""

    loss: float
    marks: StepMarks


def _no_phase(_name: str) -> ContextManager[Any]:
    return contextlib.nullcontext()


@dataclass
class TrainStep:
    """A model, its optimizer and loss, where its batches come from, and how it runs.

    ``batches`` is a pool ``next_batch`` cycles through (may be empty when every ``run``
    is given its batch). ``device``: batches are moved there (the model is the caller's
    to move). ``channels_last`` / ``autocast_dtype``: the forward policy
    (``forward_with_policy``).
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    loss_fn: Callable[[Any, Any], torch.Tensor]
    batches: Sequence[tuple[Any, Any]] = ()
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    channels_last: bool = False
    autocast_dtype: torch.dtype | None = None
    _cursor: int = field(default=0, repr=False)

    def next_batch(self) -> tuple[Any, Any]:
        """The next (inputs, targets) of the pool, cycling forever."""
        if not self.batches:
            raise ValueError("this TrainStep has no batch pool: pass each step its batch")
        batch = self.batches[self._cursor % len(self.batches)]
        self._cursor += 1
        return batch

    def forward(self, inputs: Any) -> Any:
        """``model(inputs)`` under the step's channels_last / autocast policy."""
        return forward_with_policy(self.model, inputs, self.channels_last, self.autocast_dtype)

    def run(
        self,
        batch: tuple[Any, Any] | Callable[[], tuple[Any, Any]] | None = None,
        *,
        phase: PhaseHook | None = None,
        around_forward: ContextManager[Any] | None = None,
        before_update: Callable[[], None] | None = None,
    ) -> StepResult:
        """One training step on ``batch`` (a pair, a function returning one, or the pool's
        next); returns its loss and phase marks. See the module docstring for the hooks."""
        mark = phase or _no_phase
        start = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        zeroed = time.perf_counter()
        with mark("data"):
            inputs, targets = batch() if callable(batch) else (batch if batch is not None else self.next_batch())
            if self.device.type != "cpu":
                inputs, targets = to_device((inputs, targets), self.device)
        data = time.perf_counter()
        with around_forward if around_forward is not None else contextlib.nullcontext():
            outputs = self.forward(inputs)
            forward = time.perf_counter()
            with mark("loss"):
                loss = self.loss_fn(outputs, targets)
        loss_end = time.perf_counter()
        loss.backward()
        backward = time.perf_counter()
        if before_update is not None:
            before_update()
        self.optimizer.step()
        end = time.perf_counter()
        return StepResult(float(loss.detach()), StepMarks(start, zeroed, data, forward, loss_end, backward, end))


__all__ = ["PHASES", "PhaseHook", "StepMarks", "StepResult", "TrainStep", "floating_to_fp32",
           "forward_with_policy", "to_device"]

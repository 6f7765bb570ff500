"""``TrainStep``: the one training state every job runs, and its one step order.

A ``TrainStep`` is a model being trained: model, optimizer and loss; one data source with
one cursor (a batch pool or a data loader); the policy (channels_last, autocast dtype,
device, compiled, the process environment recipes ask for); and, when ``build_workload``
built it, the workload's identity and metadata. Recipes change a ``clone()`` of it,
capture and memory observe its ``run()``, a distributed rank trains with it.

    zero_grad(set_to_none=True)                 # "optimizer": frees last step's gradients first
    inputs, targets = batch (on the device)     # "data"
    outputs = forward(inputs)                   # "forward": channels_last / BF16 autocast here
    loss = loss_fn(outputs, targets)            # "loss": always fp32
    loss.backward()                             # "backward"
    optimizer.step()                            # "optimizer"
    loss value = float(loss.detach())

Capture, optimize, memory, distributed and the pipeline's plain reference add their
observation through hooks: ``phase(name)`` wraps the data and loss phases (a profiler sees
forward, backward and the optimizer through module, autograd and optimizer hooks, but not
these two), ``around_forward`` wraps forward and loss (memory's offloading and counters),
``before_update`` runs between backward and the update (optimize reads gradients there).
Every step also records when each phase ended (``StepResult.marks``).
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ContextManager

import torch
from torch import nn

from .errors import InputError
from .vocabulary import PHASES

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
    """A model being trained: what a recipe, a capture, a memory measurement and a rank need.

    Data: ``batches`` is a pool of (inputs, targets) that ``next_batch`` cycles through
    (shared between clones, never modified); ``data_loader``, when given, is the source
    instead (cycled, restarted at its end; ``batches`` then only holds a sample). Both may
    be empty when every ``run`` is given its batch. One cursor serves ``next_batch`` and
    ``run``; ``rewind`` starts the data again.

    Policy: ``device`` (batches are moved there; the model is the caller's to move),
    ``channels_last`` / ``autocast_dtype`` (``forward_with_policy``), ``compiled`` (a
    ``torch.compile``d model: it cannot be cloned), ``env`` (process settings such as
    LD_PRELOAD, OMP_* that accepted recipes ask for; they act only in a process started
    with them), ``applied`` (the recipes applied, in order).

    Identity, set by ``build_workload``: ``name`` and ``build_args`` rebuild this state in
    another process (``rebuild_args``); ``config`` (the resolved knobs and what the build
    noted) and ``items_per_batch`` describe it in a Run.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    loss_fn: Callable[[Any, Any], torch.Tensor]
    batches: Sequence[tuple[Any, Any]] = ()
    data_loader: Any = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    channels_last: bool = False
    autocast_dtype: torch.dtype | None = None
    compiled: bool = False
    env: dict[str, str] = field(default_factory=dict)
    applied: list[str] = field(default_factory=list)
    name: str = ""
    build_args: dict[str, Any] | None = None
    config: dict[str, Any] = field(default_factory=dict)
    items_per_batch: int | None = None
    _cursor: int = field(default=0, repr=False)
    _loader_iter: Iterator[Any] | None = field(default=None, repr=False)

    # -- data ------------------------------------------------------------------------------
    def next_batch(self) -> tuple[Any, Any]:
        """The next (inputs, targets): from the data loader (cycling) or the batch pool."""
        if self.data_loader is not None:
            if self._loader_iter is None:
                self._loader_iter = iter(self.data_loader)
            try:
                return next(self._loader_iter)
            except StopIteration:
                self._loader_iter = iter(self.data_loader)
                return next(self._loader_iter)
        if not self.batches:
            raise InputError("this TrainStep has no data: give it batches or a data_loader, "
                             "or pass each run() its batch")
        batch = self.batches[self._cursor % len(self.batches)]
        self._cursor += 1
        return batch

    def rewind(self) -> None:
        """Start the data from the beginning again (same order for every arm)."""
        self._cursor = 0
        self._loader_iter = None

    def sample_inputs(self) -> Any:
        """The first batch's inputs (for tracing and FLOP counting)."""
        if self.batches:
            return self.batches[0][0]
        if self.data_loader is None:
            raise InputError("this TrainStep has no data to take a sample from: give it batches or a data_loader")
        return next(iter(self.data_loader))[0]

    # -- the step --------------------------------------------------------------------------
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
        """One training step on ``batch`` (a pair, a function returning one, or the data
        source's next); returns its loss and phase marks. See the module docstring for the hooks."""
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

    def optimized_grads(self) -> dict[str, torch.Tensor]:
        """Gradients of the parameters the optimizer updates (groups with lr != 0), by
        (uncompiled) parameter name, copied as fp32."""
        names = parameter_names(self.model)
        out: dict[str, torch.Tensor] = {}
        for group in self.optimizer.param_groups:
            if float(group.get("lr", 1.0)) == 0.0:
                continue
            for p in group["params"]:
                if p.grad is not None and id(p) in names:
                    out[names[id(p)]] = p.grad.detach().float().clone()
        return out

    # -- copies and identity ---------------------------------------------------------------
    def clone(self) -> "TrainStep":
        """An independent copy: model, optimizer and loss deep-copied together (so the
        optimizer holds the copied parameters), the data shared, the cursor at the start."""
        if self.compiled:
            raise InputError("cannot clone a compiled TrainStep; clone before torch_compile is applied")
        model, optimizer, loss_fn = copy.deepcopy((self.model, self.optimizer, self.loss_fn))
        return TrainStep(
            model=model,
            optimizer=optimizer,
            loss_fn=loss_fn,
            batches=self.batches,
            data_loader=self.data_loader,
            device=self.device,
            channels_last=self.channels_last,
            autocast_dtype=self.autocast_dtype,
            compiled=False,
            env=dict(self.env),
            applied=list(self.applied),
            name=self.name,
            build_args=copy.deepcopy(self.build_args),
            config=copy.deepcopy(self.config),
            items_per_batch=self.items_per_batch,
        )

    def rebuild_args(self) -> dict[str, Any] | None:
        """``{"name": ..., **build_args}``: what ``build_workload`` needs to build this state
        again in another process; None when no built-in workload built it."""
        if self.build_args is None or not self.name:
            return None
        return {"name": self.name, **self.build_args}


def parameter_names(model: nn.Module) -> dict[int, str]:
    """id(parameter) -> its name, without torch.compile's ``_orig_mod.`` prefix."""
    return {id(p): name.replace("_orig_mod.", "") for name, p in model.named_parameters()}


__all__ = ["PHASES", "PhaseHook", "StepMarks", "StepResult", "TrainStep", "floating_to_fp32",
           "forward_with_policy", "parameter_names", "to_device"]

"""``TrainSetup``: one trainable configuration (model, optimizer, loss, data, step policy).

Recipes turn one setup into another; the A/B test and the numerics check run them side by
side. The step is a workload's: the shared ``TrainStep`` (``profilednn.train_step``) on
the setup's model, optimizer, loss and forward policy (channels_last inputs / BF16
autocast when set, the loss always fp32).

``clone()`` deep-copies model, optimizer and loss together (the optimizer keeps pointing
at the copied parameters) and shares the data, so every candidate starts from the same
weights without touching the caller's objects.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..errors import InputError
from ..train_step import TrainStep, forward_with_policy


@dataclass
class TrainSetup:
    """A model with its optimizer, loss, training batches and step policy.

    ``batches`` is a list of (inputs, targets) the step cycles through (shared between
    clones, never modified); ``data_loader``, when given, replaces it. ``channels_last``
    converts 4-D inputs each step; ``autocast_dtype`` runs the forward under CPU autocast
    and casts floating outputs back to fp32 before the loss. ``env`` holds process-level
    settings (LD_PRELOAD, OMP_*) that accepted recipes ask for; they act only in a process
    started with them. ``workload`` names a built-in workload (name and build arguments)
    so that a child process can rebuild this setup.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    loss_fn: Callable[[Any, Any], torch.Tensor]
    batches: list[tuple[Any, Any]]
    channels_last: bool = False
    autocast_dtype: torch.dtype | None = None
    compiled: bool = False
    data_loader: Any = None
    env: dict[str, str] = field(default_factory=dict)
    applied: list[str] = field(default_factory=list)
    workload: dict[str, Any] | None = None
    _cursor: int = field(default=0, repr=False)
    _loader_iter: Iterator[Any] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.batches and self.data_loader is None:
            raise InputError("a TrainSetup needs at least one (inputs, targets) batch or a data_loader")

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
        batch = self.batches[self._cursor % len(self.batches)]
        self._cursor += 1
        return batch

    def rewind(self) -> None:
        """Start the data from the beginning again (same order for every arm)."""
        self._cursor = 0
        self._loader_iter = None

    # -- the step --------------------------------------------------------------------------
    def forward(self, inputs: Any) -> Any:
        return forward_with_policy(self.model, inputs, self.channels_last, self.autocast_dtype)

    def step(self, grads_out: dict[str, torch.Tensor] | None = None) -> float:
        """One training step; returns the loss. With ``grads_out``, the gradients of the
        optimized parameters (by name) are copied into it between backward and update."""
        keep_grads = (lambda: grads_out.update(self.optimized_grads())) if grads_out is not None else None
        return self.as_train_step().run(self.next_batch, before_update=keep_grads).loss

    def as_train_step(self) -> TrainStep:
        """The setup's model (as it is now: recipes may replace it), optimizer, loss and
        forward policy as a ``TrainStep``; batches come from ``next_batch``."""
        return TrainStep(self.model, self.optimizer, self.loss_fn, channels_last=self.channels_last,
                         autocast_dtype=self.autocast_dtype)

    def optimized_grads(self) -> dict[str, torch.Tensor]:
        """Gradients of the parameters the optimizer updates (groups with lr != 0), by
        (uncompiled) parameter name."""
        names = parameter_names(self.model)
        out: dict[str, torch.Tensor] = {}
        for group in self.optimizer.param_groups:
            if float(group.get("lr", 1.0)) == 0.0:
                continue
            for p in group["params"]:
                if p.grad is not None and id(p) in names:
                    out[names[id(p)]] = p.grad.detach().float().clone()
        return out

    # -- copies ----------------------------------------------------------------------------
    def clone(self) -> "TrainSetup":
        """An independent copy: model, optimizer and loss deep-copied together (so the
        optimizer holds the copied parameters); data shared."""
        if self.compiled:
            raise InputError("cannot clone a compiled setup; clone before torch_compile is applied")
        model, optimizer, loss_fn = copy.deepcopy((self.model, self.optimizer, self.loss_fn))
        return TrainSetup(
            model=model,
            optimizer=optimizer,
            loss_fn=loss_fn,
            batches=self.batches,
            channels_last=self.channels_last,
            autocast_dtype=self.autocast_dtype,
            compiled=False,
            data_loader=self.data_loader,
            env=dict(self.env),
            applied=list(self.applied),
            workload=copy.deepcopy(self.workload),
        )

    def sample_inputs(self) -> Any:
        """The first batch's inputs (for tracing and FLOP counting)."""
        if self.batches:
            return self.batches[0][0]
        return next(iter(self.data_loader))[0]


def parameter_names(model: nn.Module) -> dict[int, str]:
    """id(parameter) -> its name, without torch.compile's ``_orig_mod.`` prefix."""
    return {id(p): name.replace("_orig_mod.", "") for name, p in model.named_parameters()}


def setup_from_workload(workload: Any, build_args: dict[str, Any] | None = None) -> TrainSetup:
    """A TrainSetup from a built-in ``Workload`` (its model, optimizer, loss and pool)."""
    return TrainSetup(
        model=workload.model,
        optimizer=workload.optimizer,
        loss_fn=workload.loss_fn,
        batches=list(workload.batches),
        channels_last=bool(workload.channels_last),
        autocast_dtype=workload.autocast_dtype,
        workload={"name": workload.name, **(build_args or {})},
    )


__all__ = ["TrainSetup", "parameter_names", "setup_from_workload"]

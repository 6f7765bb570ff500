"""What a pipeline trains, built the same (seeded) way in every process: the digits MLP
on real data, or a built-in workload on its synthetic batches."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ...train_step import TrainStep
from .stages import LayerSequence, as_layer_sequence

DIGITS = "digits_mlp"


@dataclass
class PipelineTask:
    """What a pipeline trains: the model as a layer sequence, its loss, how to make an
    optimizer for a stage, the mini-batches in order, and (digits) a test set."""

    layers: LayerSequence
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    make_optimizer: Callable[[nn.Module], torch.optim.Optimizer]
    batches: list[tuple[torch.Tensor, torch.Tensor]]
    test: tuple[torch.Tensor, torch.Tensor] | None = None

    def plain_step(self) -> TrainStep:
        """The whole model, unsplit, as one ``TrainStep`` on one device (the reference the
        pipeline's accuracy is compared with); the mini-batches are its pool."""
        model = self.layers.model
        return TrainStep(model, self.make_optimizer(model), self.loss_fn, self.batches)


def digits_task(batch_size: int, epochs: int, lr: float, seed: int) -> PipelineTask:
    from ...workloads.digits import digits_mlp, load_digits_data

    data = load_digits_data(seed=seed)
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(epochs):
        order = torch.randperm(len(data.y_train), generator=gen)
        for i in range(0, len(order) - batch_size + 1, batch_size):  # full batches only
            idx = order[i:i + batch_size]
            batches.append((data.x_train[idx], data.y_train[idx]))
    model = digits_mlp(seed=seed)
    return PipelineTask(as_layer_sequence(model), nn.CrossEntropyLoss(),
                 lambda m: torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9), batches,
                 (data.x_test, data.y_test))


def workload_task(name: str, steps: int, knobs: dict[str, Any]) -> PipelineTask:
    from ...workloads import build_workload

    state = build_workload(name, **knobs)
    opt_type, defaults = type(state.optimizer), dict(state.optimizer.defaults)
    batches = [state.batches[i % len(state.batches)] for i in range(steps)]
    return PipelineTask(as_layer_sequence(state.model), state.loss_fn,
                 lambda m: opt_type(m.parameters(), **defaults), batches)


def build_task(spec: dict[str, Any]) -> PipelineTask:
    """The task a spec names (the same in every process: seeded)."""
    if spec["name"] == DIGITS:
        return digits_task(spec["batch_size"] or 64, spec["epochs"], spec["lr"], spec["seed"])
    knobs = dict(spec.get("knobs") or {})
    if spec["batch_size"] is not None:
        knobs["batch_size"] = spec["batch_size"]
    torch.manual_seed(spec["seed"])
    return workload_task(spec["name"], spec["steps"], {**knobs, "seed": spec["seed"]})


__all__ = ["DIGITS", "PipelineTask", "build_task", "digits_task", "workload_task"]

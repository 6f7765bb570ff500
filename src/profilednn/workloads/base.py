"""What every built-in workload is: a ``WorkloadSpec`` (what can be built, and with which
knobs), and the assembly (``finish_workload``) of what one build gives: the one training
state, a ``TrainStep`` (``profilednn.train_step``) with the workload's name, config and
synthetic batch pool.

The step is deliberately plain, so that a profiler can put its observation (hooks,
markers, timers) around each phase without the step hiding any: zero_grad, next batch,
forward (autocast / channels_last applied there), loss (always fp32), backward, optimizer
step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ..train_step import TrainStep
from ..vocabulary import TORCH_DTYPE

# Knobs every workload takes besides its own (they are arguments of build_workload).
COMMON_KNOBS: tuple[str, ...] = ("dtype", "channels_last", "seed")
# The dtypes a workload trains in -> its autocast dtype (fp32: no autocast).
DTYPES: dict[str, torch.dtype | None] = {
    name: None if name == "fp32" else getattr(torch, TORCH_DTYPE[name]) for name in ("fp32", "bf16")}


@dataclass(frozen=True)
class WorkloadSpec:
    """What a built-in workload is and which knobs it takes (with their defaults).

    ``knobs`` are the names ``build_workload`` accepts for this workload besides
    ``dtype``, ``channels_last`` and ``seed``; ``defaults`` maps each knob to its default.
    ``ranges`` gives inclusive (low, high) bounds for knobs whose bounds are not the
    usual ones (integers >= 1, floats > 0); ``None`` leaves a side open.
    """

    name: str
    description: str
    family: str  # "vision" | "detection" | "transformer" | "recurrent"
    item: str  # what one batch item is: "images" or "sequences"
    defaults: Mapping[str, Any]
    knobs: tuple[str, ...]
    min_image_size: int | None = None
    ranges: Mapping[str, tuple[float | None, float | None]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view (for ``profilednn models --json`` and Run manifests)."""
        return {
            "name": self.name,
            "description": self.description,
            "family": self.family,
            "item": self.item,
            "defaults": dict(self.defaults),
            "knobs": list(self.knobs),
            "common_knobs": list(COMMON_KNOBS),
            "min_image_size": self.min_image_size,
        }


class TokenCrossEntropy(torch.nn.Module):
    """Cross-entropy over every position of a sequence: logits [B, S, V], targets [B, S];
    targets equal to ``ignore_index`` (-100) do not count."""

    def __init__(self, ignore_index: int = -100) -> None:
        super().__init__()
        self.ignore_index = ignore_index

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), targets.flatten(), ignore_index=self.ignore_index
        )


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(all parameters, trainable parameters) of ``model``, counting tied weights once."""
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return total, trainable


def finish_workload(
    name: str,
    model: torch.nn.Module,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    make_optimizer: Callable[[torch.nn.Module], torch.optim.Optimizer],
    config: dict[str, Any],
    batches: list[tuple[Any, Any]],
) -> TrainStep:
    """Assemble a built workload's ``TrainStep`` from its parts, applying dtype and
    channels_last from ``config``; ``batches`` become its pool (CPU tensors, deterministic
    per seed, cycled by ``next_batch``, so producing data costs nothing inside a profile).

    The optimizer is made last (``make_optimizer(model)``), after any memory-format
    conversion, so it holds the parameters the model trains with.

    ``config`` must hold the resolved ``batch_size``, ``dtype`` and ``channels_last``; a
    model whose inputs are not 4-D images ignores channels_last and says so in
    ``config["notes"]``.
    """
    notes: list[str] = config.setdefault("notes", [])
    image_inputs = isinstance(batches[0][0], torch.Tensor) and batches[0][0].dim() == 4
    channels_last = bool(config["channels_last"])
    if channels_last and not image_inputs:
        notes.append(f"channels_last ignored: {name} takes token ids, not 4-D images")
        channels_last = False
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        batches = [
            (inputs.contiguous(memory_format=torch.channels_last), targets)
            for inputs, targets in batches
        ]
    config["channels_last"] = channels_last
    autocast_dtype = DTYPES[config["dtype"]]
    if autocast_dtype is not None:
        notes.append(
            "bf16: torch.autocast('cpu', dtype=torch.bfloat16) around forward; "
            "outputs cast to fp32 before the loss"
        )
    model.train()
    optimizer = make_optimizer(model)
    total, trainable = count_parameters(model)
    config["parameters"] = total
    config["trainable_parameters"] = trainable
    config["data_pool_batches"] = len(batches)
    config["optimizer"] = type(optimizer).__name__
    config["optimizer_args"] = {
        key: value
        for key, value in optimizer.defaults.items()
        if isinstance(value, (int, float, bool, str, tuple)) or value is None
    }
    return TrainStep(
        model=model,
        optimizer=optimizer,
        loss_fn=loss_fn,
        batches=batches,
        channels_last=channels_last,
        autocast_dtype=autocast_dtype,
        name=name,
        config=config,
        items_per_batch=int(config["batch_size"]),
    )

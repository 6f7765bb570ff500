"""The training footprint per layer: parameters, gradients, optimizer state, activations
saved for backward (predicted and measured), forward workspace; and the step's predicted
vs measured peak.

*Predicted* numbers come from the model's structure alone: parameter sizes, the
optimizer's type (how many state tensors per parameter), and the saved-activation rules of
``activations.predict_saved_activations``. *Measured* numbers come from running a step:
``saved_tensors_hooks`` for saved activations, the optimizer's real state, allocator events
for the peak and workspace (see ``peak``).

The predicted peak is a simple sum: weights + buffers + gradients + optimizer state +
saved activations + the batch + the largest layer's input and output (the gradient
tensors alive while the layer runs backward). It ignores the allocator's reuse timing, so
it is an estimate; the table shows how far it is from the measured peak.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl
import torch
from torch import nn

from ..tables import MEMORY_LAYERS, MEMORY_SUMMARY
from .activations import LOSS_NAME, SavedTensorCounter, predict_saved_activations
from .peak import live_bytes, measure_step_peak
from ..train_step import TrainStep

# State tensors per parameter, by optimizer type, when it has not stepped yet.
_STATE_PER_PARAM: dict[str, Any] = {
    "SGD": lambda g: 1 if g.get("momentum", 0) else 0,
    "Adam": lambda g: 3 if g.get("amsgrad") else 2,
    "AdamW": lambda g: 3 if g.get("amsgrad") else 2,
    "NAdam": lambda g: 2, "RAdam": lambda g: 2, "Adamax": lambda g: 2,
    "Adagrad": lambda g: 1, "Adadelta": lambda g: 2,
    "RMSprop": lambda g: 1 + (1 if g.get("momentum", 0) else 0) + (1 if g.get("centered") else 0),
    "Rprop": lambda g: 2,
}

LAYER_SCHEMA = MEMORY_LAYERS.schema  # the catalogue's (profilednn.tables)


def predict_optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> dict[int, int]:
    """Predicted state bytes per parameter (by ``id``) from the optimizer's type and options."""
    rule = _STATE_PER_PARAM.get(type(optimizer).__name__)
    out: dict[int, int] = {}
    for group in optimizer.param_groups:
        per = rule(group) if rule is not None else 2
        for p in group["params"]:
            if p.requires_grad:
                out[id(p)] = per * p.numel() * p.element_size()
    return out


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> dict[int, int]:
    """Measured state bytes per parameter (by ``id``): the tensors in ``optimizer.state``."""
    out: dict[int, int] = {}
    for p, state in optimizer.state.items():
        out[id(p)] = sum(v.numel() * v.element_size() for v in state.values() if isinstance(v, torch.Tensor))
    return out


@dataclass
class Footprint:
    """``layers``: one row per module (``LAYER_SCHEMA``); ``summary``: totals and peaks."""

    layers: pl.DataFrame
    summary: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    def summary_table(self) -> pl.DataFrame:
        """Quantity, predicted bytes, measured bytes: the side-by-side view."""
        s = self.summary
        rows = [
            ("parameters", s["params_bytes"], s["params_bytes"]),
            ("buffers", s["buffers_bytes"], s["buffers_bytes"]),
            ("gradients", s["grad_predicted_bytes"], s["grad_bytes"]),
            ("optimizer state", s["optimizer_state_predicted_bytes"], s["optimizer_state_bytes"]),
            ("saved activations", s["saved_predicted_bytes"], s["saved_measured_bytes"]),
            ("batch", s["batch_bytes"], s["batch_bytes"]),
            ("workspace (largest layer)", s["io_max_bytes"], s["workspace_max_bytes"]),
            ("peak", s["predicted_peak_bytes"], s["measured_peak_bytes"]),
        ]
        return pl.DataFrame(rows, schema=MEMORY_SUMMARY.schema, orient="row")


def predict_peak_bytes(state: TrainStep) -> int:
    """The predicted peak of ``state``'s step on its first batch (``training.on_device``),
    from structure alone (no training step runs: one ``no_grad`` forward gives the shapes)."""
    model, optimizer = state.model, state.optimizer
    inputs, targets = state.batches[0]
    prediction = predict_saved_activations(model, inputs, state.loss_fn, targets, forward=state.forward)
    return _predicted_peak(model, optimizer, prediction, live_bytes((inputs, targets)))


def _predicted_peak(model: nn.Module, optimizer: torch.optim.Optimizer, prediction: Any, batch_bytes: int) -> int:
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    grads = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    state = sum(predict_optimizer_state_bytes(optimizer).values())
    io_max = max(prediction.io_by_module.values(), default=0)
    return params + buffers + grads + state + prediction.total + batch_bytes + io_max


def _param_owner(model: nn.Module) -> dict[int, str]:
    owner: dict[int, str] = {}
    for name, module in model.named_modules():
        for p in module.parameters(recurse=False):
            owner.setdefault(id(p), name or "(model)")
    return owner


def _layer_table(model: nn.Module, state_measured: dict[int, int], prediction: Any, counter: Any,
                 workspace_by_module: dict[str, int], loss_type: str) -> pl.DataFrame:
    """One row per module (``LAYER_SCHEMA``): its parameters, gradients, optimizer state, saved
    activations predicted and measured, workspace and in/out bytes; in the model's order."""
    owner = _param_owner(model)
    per: dict[str, dict[str, int]] = {}

    def row(name: str) -> dict[str, int]:
        return per.setdefault(name, {k: 0 for k in LAYER_SCHEMA if k.endswith("_bytes")})

    for p in model.parameters():
        r = row(owner[id(p)])
        r["params_bytes"] += p.numel() * p.element_size()
        if p.grad is not None:
            r["grad_bytes"] += p.grad.numel() * p.grad.element_size()
        r["optimizer_state_bytes"] += state_measured.get(id(p), 0)
    for name, b in prediction.by_module.items():
        row(name)["saved_predicted_bytes"] += b
    for name, b in counter.by_module.items():
        row(name)["saved_measured_bytes"] += b
    for name, b in workspace_by_module.items():
        row(name)["workspace_bytes"] = b
    for name, b in prediction.io_by_module.items():
        row(name)["io_bytes"] = b
    types = {**prediction.module_types, LOSS_NAME: loss_type}
    order = {name: i for i, name in enumerate(types)}
    return pl.DataFrame(
        [{"module": name, "module_type": types.get(name, ""), **vals}
         for name, vals in sorted(per.items(), key=lambda kv: order.get(kv[0], len(order)))],
        schema=LAYER_SCHEMA,
    )


def measure_footprint(state: TrainStep, warmup: int = 1) -> Footprint:
    """Predict and measure the footprint of ``state``'s training step on its first batch
    (``training.on_device``: the pool is that one batch).

    ``warmup`` steps run first (at least one, so the optimizer's state exists and the
    measured step is a steady one).
    """
    model, optimizer = state.model, state.optimizer
    batch = state.batches[0]
    inputs, targets = batch
    for _ in range(max(1, warmup)):
        state.run(batch)
    prediction = predict_saved_activations(model, inputs, state.loss_fn, targets, forward=state.forward)
    counter = SavedTensorCounter(model)
    # Free the gradients before observing: the profiler cannot see frees of blocks
    # allocated before it started, so the step must start from memory it will not free.
    optimizer.zero_grad(set_to_none=True)
    peak = measure_step_peak(lambda: state.run(batch, around_forward=counter), model,
                             live=(model, optimizer, (inputs, targets)), device=state.device)

    state_measured = optimizer_state_bytes(optimizer)
    state_predicted = predict_optimizer_state_bytes(optimizer)
    layers = _layer_table(model, state_measured, prediction, counter, peak.workspace_by_module,
                          type(state.loss_fn).__name__)

    params_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers_bytes = sum(b.numel() * b.element_size() for b in model.buffers())
    grad_predicted = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    batch_bytes = live_bytes((inputs, targets))
    io_max = max(prediction.io_by_module.values(), default=0)
    predicted_peak = _predicted_peak(model, optimizer, prediction, batch_bytes)
    measured_peak = peak.peak_bytes
    summary: dict[str, Any] = {
        "workload": state.name,
        "batch_size": state.items_per_batch,
        "device": str(state.device),
        "params_bytes": params_bytes,
        "buffers_bytes": buffers_bytes,
        "grad_bytes": int(layers["grad_bytes"].sum()),
        "grad_predicted_bytes": grad_predicted,
        "optimizer": type(optimizer).__name__,
        "optimizer_state_bytes": sum(state_measured.values()),
        "optimizer_state_predicted_bytes": sum(state_predicted.values()),
        "saved_predicted_bytes": prediction.total,
        "saved_measured_bytes": counter.total,
        "saved_error": (prediction.total / counter.total - 1.0) if counter.total else None,
        "batch_bytes": batch_bytes,
        "io_max_bytes": io_max,
        "workspace_max_bytes": max(peak.workspace_by_module.values(), default=0),
        "baseline_bytes": peak.baseline_bytes,
        "predicted_peak_bytes": predicted_peak,
        "measured_peak_bytes": measured_peak,
        "tensor_peak_bytes": peak.tensor_peak_bytes,
        "peak_error": predicted_peak / measured_peak - 1.0 if measured_peak else None,
        "rss_start_bytes": peak.rss_start_bytes,
        "rss_peak_bytes": peak.rss_peak_bytes,
        "accelerator_peak_bytes": peak.accelerator_peak_bytes,
    }
    return Footprint(layers=layers, summary=summary, notes=_notes(prediction, counter))


def _notes(prediction: Any, counter: Any) -> list[str]:
    """What the prediction assumed, and what it missed."""
    notes = [f"no saved-activation rule for {a}: assumed it keeps its input" for a in prediction.assumed]
    unpredicted = [n for n, b in counter.by_module.items() if b and n not in prediction.by_module]
    if unpredicted:
        notes.append("tensors saved by functional code outside leaf layers (not predicted): "
                     + ", ".join(unpredicted))
    return notes


__all__ = [
    "Footprint",
    "LAYER_SCHEMA",
    "measure_footprint",
    "optimizer_state_bytes",
    "predict_optimizer_state_bytes",
    "predict_peak_bytes",
]

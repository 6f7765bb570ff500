"""Activations saved for backward, per layer: measured and predicted.

*Measured*: ``SavedTensorCounter`` sits in ``torch.autograd.graph.saved_tensors_hooks``
during a forward pass and records every tensor autograd saves, attributed to the
innermost module running at that moment and counted once per storage (a ReLU's output
that the next max-pool saves again costs memory once). Storages of parameters and buffers
are not activations and are left out (they are the weights' own memory).

*Predicted*: ``predict_saved_activations`` never looks at autograd. It runs the model
once under ``torch.no_grad`` with hooks that only see each leaf module's input and output
(shape, dtype, storage), and applies a rule per layer type (a convolution keeps its
input, a ReLU its output, a max-pool its input plus int64 indices, a batch norm its input
plus two per-channel fp32 statistics, ...). The two agree when the rules are right; a layer
type without a rule is assumed to keep its input and is flagged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

LOSS_NAME = "loss"
ROOT_NAME = "(model)"


def _storage_key(t: torch.Tensor) -> tuple[str, int]:
    return (str(t.device), t.untyped_storage().data_ptr())


def state_storage_keys(*modules: nn.Module) -> set[tuple[str, int]]:
    """Storages of every parameter and buffer of ``modules`` (not activations)."""
    keys: set[tuple[str, int]] = set()
    for module in modules:
        for t in [*module.parameters(), *module.buffers()]:
            keys.add(_storage_key(t))
    return keys


class ModuleStack:
    """Hooks that keep the name of the innermost module currently running its forward."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.stack: list[str] = []
        self.types: dict[str, str] = {}
        self._handles: list[Any] = []

    @property
    def current(self) -> str:
        return self.stack[-1] if self.stack else LOSS_NAME

    def __enter__(self) -> "ModuleStack":
        for name, module in self.model.named_modules():
            label = name or ROOT_NAME
            self.types[label] = type(module).__name__
            self._handles.append(module.register_forward_pre_hook(self._push(label)))
            self._handles.append(module.register_forward_hook(self._pop(label), always_call=True))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.stack.clear()

    def _push(self, label: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any) -> None:
            self.stack.append(label)
        return hook

    def _pop(self, label: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if self.stack and self.stack[-1] == label:
                self.stack.pop()
        return hook


@dataclass
class SavedTensorCounter:
    """Count the bytes autograd saves, per module, once per storage.

    Use around a forward (and loss) pass::

        with SavedTensorCounter(model) as counter:
            loss = loss_fn(model(x), y)
        counter.by_module   # {"features.0": 73728, ..., "loss": 1320}

    Tensors saved outside any module of ``model`` are attributed to ``"loss"``.
    """

    model: nn.Module
    exclude: set[tuple[str, int]] = field(default_factory=set)
    by_module: dict[str, int] = field(default_factory=dict)
    tensors: int = 0
    storages: int = 0

    def __post_init__(self) -> None:
        self.exclude = self.exclude | state_storage_keys(self.model)
        self._seen: set[tuple[str, int]] = set()
        self._modules = ModuleStack(self.model)
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _identity)

    @property
    def total(self) -> int:
        return sum(self.by_module.values())

    @property
    def module_types(self) -> dict[str, str]:
        return self._modules.types

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        self.tensors += 1
        key = _storage_key(t)
        if key in self.exclude or key in self._seen:
            return t
        self._seen.add(key)
        self.storages += 1
        name = self._modules.current
        self.by_module[name] = self.by_module.get(name, 0) + t.untyped_storage().nbytes()
        return t

    def __enter__(self) -> "SavedTensorCounter":
        self._modules.__enter__()
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)
        self._modules.__exit__(*exc)


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


# --------------------------------------------------------------------------- prediction
Saved = tuple[torch.Tensor | None, int]  # (tensor whose storage is kept, or None for a new one; bytes)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _input(inp: torch.Tensor, out: torch.Tensor, m: nn.Module) -> list[Saved]:
    return [(inp, _nbytes(inp))]


def _output(inp: torch.Tensor, out: torch.Tensor, m: nn.Module) -> list[Saved]:
    return [(out, _nbytes(out))]


def _nothing(inp: torch.Tensor, out: torch.Tensor, m: nn.Module) -> list[Saved]:
    return []


def _batch_norm(inp: torch.Tensor, out: torch.Tensor, m: nn.Module) -> list[Saved]:
    stats = 2 * inp.shape[1] * 4 if m.training or not m.track_running_stats else 0  # save_mean, save_invstd
    return [(inp, _nbytes(inp)), (None, stats)]


def _group_norm(inp: torch.Tensor, out: torch.Tensor, m: nn.Module) -> list[Saved]:
    return [(inp, _nbytes(inp)), (None, 2 * inp.shape[0] * m.num_groups * 4)]


def _layer_norm(inp: torch.Tensor, out: torch.Tensor, m: nn.Module) -> list[Saved]:
    rows = inp.numel() // max(1, int(torch.Size(m.normalized_shape).numel()))
    return [(inp, _nbytes(inp)), (None, 2 * rows * 4)]


def _max_pool(inp: torch.Tensor, out: torch.Tensor, m: nn.Module) -> list[Saved]:
    return [(inp, _nbytes(inp)), (None, out.numel() * 8)]  # int64 argmax indices


def _adaptive_avg_pool(inp: torch.Tensor, out: torch.Tensor, m: nn.Module) -> list[Saved]:
    # Output size 1 is a mean over the spatial dims, which keeps only sizes.
    return [] if all(s == 1 for s in out.shape[2:]) else [(inp, _nbytes(inp))]


def _dropout(inp: torch.Tensor, out: torch.Tensor, m: nn.Module) -> list[Saved]:
    return [(None, _nbytes(inp))] if m.training and m.p > 0 else []  # the scaled mask


RULES: dict[type, Callable[[torch.Tensor, torch.Tensor, nn.Module], list[Saved]]] = {
    nn.Conv1d: _input, nn.Conv2d: _input, nn.Conv3d: _input,
    nn.ConvTranspose1d: _input, nn.ConvTranspose2d: _input, nn.ConvTranspose3d: _input,
    nn.Linear: _input, nn.Embedding: _input,
    nn.BatchNorm1d: _batch_norm, nn.BatchNorm2d: _batch_norm, nn.BatchNorm3d: _batch_norm,
    nn.GroupNorm: _group_norm, nn.LayerNorm: _layer_norm,
    nn.ReLU: _output, nn.Sigmoid: _output, nn.Tanh: _output, nn.Softmax: _output,
    nn.LogSoftmax: _output,
    nn.GELU: _input, nn.SiLU: _input, nn.LeakyReLU: _input, nn.ReLU6: _input,
    nn.Hardswish: _input, nn.Mish: _input, nn.ELU: _output,
    nn.MaxPool1d: _max_pool, nn.MaxPool2d: _max_pool, nn.MaxPool3d: _max_pool,
    nn.AdaptiveMaxPool2d: _max_pool,
    nn.AvgPool1d: _input, nn.AvgPool2d: _input, nn.AvgPool3d: _input,
    nn.AdaptiveAvgPool2d: _adaptive_avg_pool,
    nn.Dropout: _dropout, nn.Dropout2d: _dropout,
    nn.Flatten: _nothing, nn.Identity: _nothing, nn.Unflatten: _nothing,
}


def loss_saved(loss_fn: Any, outputs: Any, targets: Any) -> list[Saved]:
    """What a loss keeps: cross-entropy its log-softmax, the targets and a scalar weight;
    MSE/L1 their input and target; anything else is assumed to keep its input."""
    if not isinstance(outputs, torch.Tensor):
        return []
    target = targets if isinstance(targets, torch.Tensor) else None
    kept_target = [(target, _nbytes(target))] if target is not None else []
    if isinstance(loss_fn, nn.CrossEntropyLoss) or loss_fn is nn.functional.cross_entropy:
        return [(None, _nbytes(outputs)), *kept_target, (None, 4)]
    return [(outputs, _nbytes(outputs)), *kept_target]


@dataclass
class Prediction:
    """Predicted saved-activation bytes per module (and ``"loss"``), with the module types
    and the leaf types that had no rule (assumed to keep their input)."""

    by_module: dict[str, int]
    module_types: dict[str, str]
    assumed: list[str]
    io_by_module: dict[str, int] = field(default_factory=dict)  # input + output bytes per leaf

    @property
    def total(self) -> int:
        return sum(self.by_module.values())


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)):
        for v in value:
            t = _first_tensor(v)
            if t is not None:
                return t
    return None


def predict_saved_activations(
    model: nn.Module,
    inputs: Any,
    loss_fn: Any | None = None,
    targets: Any | None = None,
    forward: Callable[[Any], Any] | None = None,
) -> Prediction:
    """Predict, per leaf module, the bytes its backward keeps, from layer types and the
    shapes at module boundaries (one ``no_grad`` forward; autograd is not consulted)."""
    boundary: list[tuple[str, nn.Module, torch.Tensor, torch.Tensor]] = []
    keep: list[Any] = []  # hold every boundary tensor so no storage is reused mid-pass
    handles = []
    types: dict[str, str] = {}

    def hook(label: str) -> Callable[..., None]:
        def fn(module: nn.Module, args: Any, output: Any) -> None:
            inp, out = _first_tensor(args), _first_tensor(output)
            keep.append((args, output))
            if inp is not None and out is not None:
                boundary.append((label, module, inp, out))
        return fn

    for name, module in model.named_modules():
        types[name or ROOT_NAME] = type(module).__name__
        if not any(True for _ in module.children()):
            handles.append(module.register_forward_hook(hook(name or ROOT_NAME)))
    try:
        with torch.no_grad():
            outputs = (forward or model)(inputs)
    finally:
        for h in handles:
            h.remove()
    state = state_storage_keys(model)
    seen: set[tuple[str, int]] = set()
    by_module: dict[str, int] = {}
    assumed: list[str] = []

    def add(label: str, saved: Iterable[Saved]) -> None:
        for tensor, nbytes in saved:
            if tensor is not None:
                key = _storage_key(tensor)
                if key in seen or key in state:
                    continue
                seen.add(key)
            by_module[label] = by_module.get(label, 0) + nbytes

    io: dict[str, int] = {}
    for label, module, inp, out in boundary:
        io[label] = max(io.get(label, 0), _nbytes(inp) + _nbytes(out))
        rule = RULES.get(type(module))
        if rule is None:
            assumed.append(f"{label} ({type(module).__name__})")
            rule = _input
        add(label, rule(inp, out, module))
    if loss_fn is not None:
        add(LOSS_NAME, loss_saved(loss_fn, outputs, targets))
    del keep
    return Prediction(by_module=by_module, module_types=types, assumed=assumed, io_by_module=io)


__all__ = [
    "LOSS_NAME",
    "ModuleStack",
    "Prediction",
    "RULES",
    "SavedTensorCounter",
    "predict_saved_activations",
    "state_storage_keys",
]

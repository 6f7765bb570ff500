"""``frozen_batchnorm``: torchvision's ``FrozenBatchNorm2d`` folded into the convolution before it
(seed 000, 2.5).

``FrozenBatchNorm2d`` recomputes its scale and shift every call and applies them as two
elementwise passes (mul, add) over the activation, plus one in the backward. Here each one
directly after a convolution is folded into that convolution: ``conv(x, W * s) + (b * s + t)``
with the frozen per-channel scale ``s`` and shift ``t`` -- exact, and for a trainable
convolution the scaling of its (small) weight happens inside autograd, so W and its gradient
are unchanged. Any other FrozenBatchNorm2d becomes one ``addcmul`` with precomputed scale and
shift. Not injected into a script: the fold rebuilds the model.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from ..errors import ProfileDNNError
from ..extras import loaded_attribute
from ..train_step import TrainStep
from .recipe_contract import Context, Recipe
from .script_facts import ScriptFacts

def is_frozen_batchnorm(module: nn.Module) -> bool:
    """An instance of torchvision's ``FrozenBatchNorm2d`` (none exists while torchvision is
    not loaded: ``extras.loaded_attribute``)."""
    cls = loaded_attribute("torchvision.ops.misc", "FrozenBatchNorm2d")
    return cls is not None and isinstance(module, cls)


# ----------------------------------------------------------------------------- modules
def frozen_scale_shift(bn: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, shift) of a frozen batch norm: y = x * scale + shift, per channel."""
    scale = bn.weight * (bn.running_var + bn.eps).rsqrt()
    shift = bn.bias - bn.running_mean * scale
    return scale.detach().clone(), shift.detach().clone()


class FusedFrozenBatchNorm2d(nn.Module):
    """FrozenBatchNorm2d as one per-channel affine kernel (``addcmul``) with the scale and
    shift computed once (the statistics and affine parameters are frozen)."""

    def __init__(self, bn: nn.Module) -> None:
        super().__init__()
        scale, shift = frozen_scale_shift(bn)
        self.num_features = scale.numel()
        self.register_buffer("scale", scale.view(1, -1, 1, 1))
        self.register_buffer("shift", shift.view(1, -1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(self.shift, x, self.scale)

    def extra_repr(self) -> str:
        return f"{self.num_features}"


class ConvFrozenBN2d(nn.Module):
    """A Conv2d followed by a FrozenBatchNorm2d, computed as one convolution.

    Keeps the convolution's own ``weight`` (and ``bias``) Parameter objects, so optimizers
    and parameter names are unchanged. A frozen convolution (weight without grad) uses a
    weight folded once; a trainable one scales its weight per output channel in each
    forward (weight-sized work instead of two activation-sized passes).
    """

    def __init__(self, conv: nn.Conv2d, bn: nn.Module) -> None:
        super().__init__()
        if conv.padding_mode != "zeros":
            raise ProfileDNNError(f"cannot fold into a convolution with padding_mode={conv.padding_mode!r}")
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels
        self.kernel_size, self.stride, self.padding = conv.kernel_size, conv.stride, conv.padding
        self.dilation, self.groups = conv.dilation, conv.groups
        self.weight = conv.weight
        self.bias = conv.bias
        scale, shift = frozen_scale_shift(bn)
        self.register_buffer("scale", scale)
        self.register_buffer("shift", shift)
        with torch.no_grad():
            folded_bias = shift if conv.bias is None else torch.addcmul(shift, conv.bias, scale)
            self.register_buffer("folded_weight", conv.weight * scale.view(-1, 1, 1, 1))
            self.register_buffer("folded_bias", folded_bias.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight.requires_grad or (self.bias is not None and self.bias.requires_grad):
            weight = self.weight * self.scale.view(-1, 1, 1, 1)
            bias = self.shift if self.bias is None else torch.addcmul(self.shift, self.bias, self.scale)
        else:
            weight, bias = self.folded_weight, self.folded_bias
        return F.conv2d(x, weight, bias, self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, folded FrozenBatchNorm2d")


# ----------------------------------------------------------------------------- graph
def _frozen_bns(model: nn.Module) -> list[str]:
    return [name for name, m in model.named_modules() if is_frozen_batchnorm(m)]


def conv_bn_pairs(model: nn.Module, inputs: Any) -> list[tuple[str, str]]:
    """(conv name, FrozenBatchNorm2d name) pairs where the batch norm reads exactly the
    tensor the convolution wrote and no other module reads it, seen in one forward pass
    (eval mode, no grad: nothing in the model changes)."""
    produced: dict[int, tuple[str, torch.Tensor]] = {}
    readers: dict[int, int] = {}
    calls: dict[str, int] = {}
    pairs: list[tuple[str, str]] = []
    handles = []

    def on_conv(name: str):
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            calls[name] = calls.get(name, 0) + 1
            if isinstance(output, torch.Tensor):
                produced[id(output)] = (name, output)  # the reference keeps the id unique
        return hook

    def on_any(name: str, is_bn: bool):
        def hook(module: nn.Module, args: Any) -> None:
            for a in args:
                if isinstance(a, torch.Tensor) and id(a) in produced:
                    readers[id(a)] = readers.get(id(a), 0) + 1
                    if is_bn:
                        pairs.append((produced[id(a)][0], name))
        return hook

    for name, m in model.named_modules():
        if isinstance(m, nn.Conv2d):
            handles.append(m.register_forward_hook(on_conv(name)))
        if not list(m.children()) and name:
            handles.append(m.register_forward_pre_hook(on_any(name, is_frozen_batchnorm(m))))
    modes = {m: m.training for m in model.modules()}
    try:
        model.eval()
        with torch.no_grad():
            model(inputs)
    finally:
        for h in handles:
            h.remove()
        for m, training in modes.items():
            m.training = training
    conv_out = {name: tid for tid, (name, _) in produced.items()}
    return [
        (conv, bn) for conv, bn in pairs
        if calls.get(conv) == 1 and readers.get(conv_out.get(conv, -1)) == 1
    ]


def _replace(model: nn.Module, path: str, new: nn.Module) -> None:
    parent_path, _, child = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    setattr(parent, child, new)


def _sample(inputs: Any) -> Any:
    """One item of the batch: enough to see the dataflow, cheap to run."""
    if isinstance(inputs, torch.Tensor) and inputs.dim() >= 1 and inputs.shape[0] > 1:
        return inputs[:1]
    return inputs


# ----------------------------------------------------------------------------- recipe
class FrozenBatchNorm(Recipe):
    name = "frozen_batchnorm"
    family = "fusion"
    summary = ("FrozenBatchNorm2d folded into the preceding convolution (else one fused "
               "per-channel affine)")

    def check(self, setup: TrainStep, ctx: Context) -> str | None:
        if not _frozen_bns(setup.model):
            return "the model has no torchvision FrozenBatchNorm2d"
        return None

    def script_check(self, facts: ScriptFacts, ctx: Context, accepted: Collection[str] = ()) -> str | None:
        return ("not injected into a script: folding FrozenBatchNorm2d into its convolutions rebuilds the "
                "model; the Python API (profilednn.optimize) does it")

    def apply(self, setup: TrainStep, ctx: Context) -> str:
        model = setup.model
        bns = _frozen_bns(model)
        pairs = conv_bn_pairs(model, _sample(setup.sample_inputs()))
        folded_bns = set()
        frozen_convs = 0
        for conv_name, bn_name in pairs:
            conv = model.get_submodule(conv_name)
            if conv.padding_mode != "zeros":
                continue
            frozen_convs += not conv.weight.requires_grad
            _replace(model, conv_name, ConvFrozenBN2d(conv, model.get_submodule(bn_name)))
            _replace(model, bn_name, nn.Identity())
            folded_bns.add(bn_name)
        rest = [b for b in bns if b not in folded_bns]
        for bn_name in rest:
            _replace(model, bn_name, FusedFrozenBatchNorm2d(model.get_submodule(bn_name)))
        return (f"{len(folded_bns)} of {len(bns)} FrozenBatchNorm2d folded into their convolution "
                f"({frozen_convs} of those convolutions frozen: weight folded once); "
                f"{len(rest)} replaced by one addcmul each")


RECIPE = FrozenBatchNorm()

__all__ = ["ConvFrozenBN2d", "FrozenBatchNorm", "FusedFrozenBatchNorm2d", "conv_bn_pairs", "frozen_scale_shift"]

"""1x1 convolutions whose weight gradient is one GEMM: ``dW = dY^T X``.

A 1x1 convolution over channels_last (NHWC) activations is a matrix product: the
activation is an ``[N*H*W, C]`` matrix as it lies in memory, so the weight gradient is
``dY[N*H*W, out]^T @ X[N*H*W, in]`` with no copy (a stride-2 one reads every second row
and column of X first, a quarter of it). oneDNN computes it as a backward-by-weights
convolution instead, and on a 2-core Xeon with AMX that primitive ran ResNet-50's 1x1
weight gradients at 220-1,050 GFLOP/s in BF16 where the same shapes' forward ran at
~1,700 and ``torch.mm`` at 550-1,330 (``benchmarks/bench_weight_grad.py``): the weight
gradients were half of the step's convolution time.

``GemmWeightGradConv2d`` is an ``nn.Conv2d`` (same parameters, state dict and forward
values) whose training forward runs the custom op ``profilednn::conv1x1``: the forward
and the input gradient are stock ``aten.convolution`` / ``convolution_backward``; the
weight gradient is ``profilednn::conv1x1_weight_grad`` (``torch.mm``) when the
activations are channels_last, else stock. Custom ops (``torch.library``) keep
``torch.compile`` from breaking the graph or rewriting the product. Evaluation mode,
other dtypes and devices run ``nn.Conv2d``'s own forward.

``gemm_weight_grads(model)`` swaps every eligible ``nn.Conv2d`` (1x1, no padding,
dilation 1, one group, the same stride both ways) in place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import register_flop_formula

VALUE_DTYPES = (torch.float32, torch.bfloat16)


def _nhwc(t: torch.Tensor) -> bool:
    """Whether ``t`` (4-D) lies in memory as channels_last rows."""
    return t.is_contiguous(memory_format=torch.channels_last)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``[N, C, H, W]`` as the ``[N*H*W, C]`` matrix of its channels_last storage (a view
    when it already is channels_last, else one copy)."""
    return t.contiguous(memory_format=torch.channels_last).permute(0, 2, 3, 1).reshape(-1, t.shape[1])


@torch.library.custom_op("profilednn::conv1x1_weight_grad", mutates_args=())
def conv1x1_weight_grad(grad: torch.Tensor, x: torch.Tensor, stride: int) -> torch.Tensor:
    """The weight gradient ``[out, in, 1, 1]`` of a 1x1 convolution: ``dY^T @ X`` as one
    GEMM, X taken at the output's positions (every ``stride``-th row and column)."""
    if stride != 1:
        x = x[:, :, ::stride, ::stride]
    return torch.mm(_rows(grad).t(), _rows(x)).view(grad.shape[1], x.shape[1], 1, 1)


@conv1x1_weight_grad.register_fake
def _(grad, x, stride):  # noqa: ANN001, ANN202 - the op's own signature
    return grad.new_empty(grad.shape[1], x.shape[1], 1, 1)


def _convolution(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: int) -> torch.Tensor:
    return torch.ops.aten.convolution(x, weight, bias, [stride, stride], [0, 0], [1, 1], False, [0, 0], 1)


@torch.library.custom_op("profilednn::conv1x1", mutates_args=())
def conv1x1(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: int) -> torch.Tensor:
    """A 1x1 convolution (no padding, one group): stock ``aten.convolution``."""
    return _convolution(x, weight, bias, stride)


@conv1x1.register_fake
def _(x, weight, bias, stride):  # noqa: ANN001, ANN202
    return _convolution(x, weight, bias, stride)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    x, weight, bias, stride = inputs
    ctx.save_for_backward(x, weight)
    ctx.stride = stride
    ctx.bias = bias is not None


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    x, weight = ctx.saved_tensors
    need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    need_b = ctx.bias and ctx.needs_input_grad[2]
    s = ctx.stride
    gemm = need_w and _nhwc(x)  # NCHW activations would be transposed first: stock is cheaper
    gx = gw = None
    if need_x or (need_w and not gemm):
        gx, gw, _ = torch.ops.aten.convolution_backward(
            grad, x, weight, None, [s, s], [0, 0], [1, 1], False, [0, 0], 1, [need_x, need_w and not gemm, False])
    if gemm:
        gw = conv1x1_weight_grad(grad, x, s)
    gb = grad.sum((0, 2, 3)) if need_b else None
    return gx if need_x else None, gw if need_w else None, gb, None


conv1x1.register_autograd(_backward, setup_context=_setup_context)


@register_flop_formula(torch.ops.profilednn.conv1x1)
def _conv1x1_flops(x_shape: Any, w_shape: Any, bias_shape: Any, stride: int, *, out_shape: Any,
                   **kwargs: Any) -> int:
    """2 N H' W' Cout Cin, as ``torch.utils.flop_counter`` counts the convolution it is: model
    FLOPs (MFU) must not depend on which kernel ran them."""
    return 2 * math.prod(out_shape) * int(w_shape[1])


@register_flop_formula(torch.ops.profilednn.conv1x1_weight_grad)
def _weight_grad_flops(grad_shape: Any, x_shape: Any, stride: int, *, out_shape: Any, **kwargs: Any) -> int:
    """The weight gradient's GEMM: 2 (N H' W') Cout Cin, as for stock's backward-by-weights."""
    return 2 * math.prod(grad_shape) * int(x_shape[1])


def eligible(conv: nn.Module) -> bool:
    """Whether ``conv`` is a plain ``nn.Conv2d`` whose weight gradient is one GEMM: 1x1,
    no padding, dilation 1, one group, the same stride both ways."""
    return (type(conv) is nn.Conv2d and conv.kernel_size == (1, 1) and conv.groups == 1
            and tuple(conv.padding) == (0, 0) and conv.dilation == (1, 1) and conv.stride[0] == conv.stride[1])


def applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the op takes these tensors (else ``nn.Conv2d``'s own forward runs)."""
    return (x.device.type == "cpu" and weight.device.type == "cpu" and x.dim() == 4
            and x.dtype in VALUE_DTYPES and weight.dtype in VALUE_DTYPES and x.numel() > 0)


class GemmWeightGradConv2d(nn.Conv2d):
    """A 1x1 ``nn.Conv2d`` whose weight gradient is one GEMM (``dY^T X``) in training;
    the forward and the input gradient are stock's. Same parameters, buffers and state
    dict as the convolution it replaces (``from_conv`` shares them)."""

    @classmethod
    def from_conv(cls, conv: nn.Conv2d) -> "GemmWeightGradConv2d":
        """The module for ``conv`` (``eligible`` must hold), sharing its parameters."""
        if not eligible(conv):
            raise ValueError(f"not a 1x1 convolution without padding, dilation or groups: {conv}")
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.__dict__.update({k: v for k, v in conv.__dict__.items()
                             if k not in ("_parameters", "_buffers", "_modules")})
        new._parameters = conv._parameters
        new._buffers = conv._buffers
        new._modules = conv._modules
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and applies(x, self.weight)):
            return super().forward(x)
        weight, bias = self.weight, self.bias
        if torch.is_autocast_enabled("cpu"):  # as autocast would cast for F.conv2d
            dtype = torch.get_autocast_dtype("cpu")
            x, weight = x.to(dtype), weight.to(dtype)
            bias = None if bias is None else bias.to(dtype)
        if x.dtype != weight.dtype:
            return super().forward(x)
        return conv1x1(x, weight, bias, self.stride[0])


@dataclass
class WeightGradSummary:
    """What ``gemm_weight_grads`` did: the convolutions swapped, by name, and how many
    convolutions stayed stock (not 1x1, padded, grouped, dilated)."""

    swapped: list[str] = field(default_factory=list)
    other_convolutions: int = 0

    def describe(self) -> str:
        return (f"{len(self.swapped)} 1x1 Conv2d -> GemmWeightGradConv2d (weight gradient as one GEMM, "
                f"dY^T X, on channels_last activations); {self.other_convolutions} other convolutions stay stock")


def gemm_weight_grads(model: nn.Module) -> tuple[nn.Module, WeightGradSummary]:
    """``model`` with every eligible ``nn.Conv2d`` swapped in place for a
    ``GemmWeightGradConv2d`` sharing its parameters (an optimizer built on the model keeps
    working; state dict keys are unchanged)."""
    summary = WeightGradSummary()
    for parent_name, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            if eligible(child):
                setattr(parent, name, GemmWeightGradConv2d.from_conv(child))
                summary.swapped.append(f"{parent_name}.{name}" if parent_name else name)
            elif isinstance(child, nn.Conv2d) and type(child) is not GemmWeightGradConv2d:
                summary.other_convolutions += 1
    return model, summary


__all__ = ["GemmWeightGradConv2d", "WeightGradSummary", "applies", "conv1x1", "conv1x1_weight_grad", "eligible",
           "gemm_weight_grads"]

"""1x1 convolutions as GEMMs over channels_last rows: forward, input and weight gradients.

A 1x1 convolution over channels_last (NHWC) activations is a matrix product: the activation
is an ``[N*H*W, C]`` matrix as it lies in memory, so

    forward   Y  = X W^T        [N*H*W, out] = [N*H*W, in] [in, out]
    input     dX = dY W         (a stride-2 one: into every second row and column of dX)
    weight    dW = dY^T X       (a stride-2 one reads every second row and column of X)

each one ``torch.mm`` with no copy at stride 1. oneDNN runs them as convolution primitives
instead; on a 2-core Xeon with AMX, at ResNet-50's 1x1 shapes in BF16, its backward-by-weights
primitive ran at 220-1,050 GFLOP/s, a third of the forward's rate, and ``torch.mm`` beat the
forward and backward-by-data primitives too at most shapes
(``benchmarks/bench_pointwise_conv.py``).

``PointwiseGemmConv2d`` is an ``nn.Conv2d`` (same parameters, state dict and values up to the
GEMMs' rounding) whose training forward runs the custom op ``profilednn::conv1x1``, with the
backward ops ``profilednn::conv1x1_input_grad`` and ``profilednn::conv1x1_weight_grad``. On
NCHW activations the forward and the backward run stock ATen (``aten.convolution`` /
``convolution_backward``): a transpose would cost more than it saves. Custom ops (``torch.library``) keep
``torch.compile`` from breaking the graph or rewriting the products, and carry FLOP formulas,
so model FLOPs (MFU) do not depend on which kernel ran. Evaluation mode, other dtypes and
devices run ``nn.Conv2d``'s own forward.

``pointwise_gemms(model)`` swaps every eligible ``nn.Conv2d`` (1x1, no padding, dilation 1,
one group, the same stride both ways) in place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import register_flop_formula

from .compile_cache import KeyedOnKernels
from .sharing import sharing_tensors

VALUE_DTYPES = (torch.float32, torch.bfloat16)
CL = torch.channels_last


def _nhwc(t: torch.Tensor) -> bool:
    """Whether ``t`` (4-D) lies in memory as channels_last rows."""
    return t.is_contiguous(memory_format=CL)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``[N, C, H, W]`` as the ``[N*H*W, C]`` matrix of its channels_last storage (a view
    when it already is channels_last, else one copy)."""
    return t.contiguous(memory_format=CL).permute(0, 2, 3, 1).reshape(-1, t.shape[1])


def _from_rows(rows: torch.Tensor, n: int, h: int, w: int) -> torch.Tensor:
    """``[N*H*W, C]`` rows back as an ``[N, C, H, W]`` channels_last tensor (a view)."""
    return rows.view(n, h, w, rows.shape[1]).permute(0, 3, 1, 2)


def _matrix(weight: torch.Tensor) -> torch.Tensor:
    """A 1x1 weight ``[out, in, 1, 1]`` as ``[out, in]`` (a view in either memory format)."""
    return weight.reshape(weight.shape[0], weight.shape[1])


def _convolution(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: int) -> torch.Tensor:
    return torch.ops.aten.convolution(x, weight, bias, [stride, stride], [0, 0], [1, 1], False, [0, 0], 1)


def _output_side(side: int, stride: int) -> int:
    return (side - 1) // stride + 1


@torch.library.custom_op("profilednn::conv1x1", mutates_args=())
def conv1x1(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: int) -> torch.Tensor:
    """A 1x1 convolution (no padding, one group): ``X W^T (+ b)`` as one GEMM on channels_last
    rows (X taken every ``stride``-th row and column), stock ``aten.convolution`` on NCHW."""
    if not _nhwc(x):
        return _convolution(x, weight, bias, stride)
    if stride != 1:
        x = x[:, :, ::stride, ::stride]
    rows, w = _rows(x), _matrix(weight).t()
    out = torch.mm(rows, w) if bias is None else torch.addmm(bias, rows, w)
    return _from_rows(out, x.shape[0], x.shape[2], x.shape[3])


@conv1x1.register_fake
def _(x, weight, bias, stride):  # noqa: ANN001, ANN202 - the op's own signature
    n, h, w = x.shape[0], _output_side(x.shape[2], stride), _output_side(x.shape[3], stride)
    if _nhwc(x):
        return x.new_empty((n, h, w, weight.shape[0])).permute(0, 3, 1, 2)
    return _convolution(x, weight, bias, stride)


@torch.library.custom_op("profilednn::conv1x1_input_grad", mutates_args=())
def conv1x1_input_grad(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, stride: int) -> torch.Tensor:
    """The input gradient of a 1x1 convolution: ``dY W`` as one GEMM on channels_last rows,
    a channels_last tensor shaped like ``x`` (at stride > 1 written into every
    ``stride``-th row and column of zeros)."""
    rows = torch.mm(_rows(grad), _matrix(weight))
    n, _, h, w = x.shape
    if stride == 1:
        return _from_rows(rows, n, h, w)
    dx = x.new_zeros((n, h, w, x.shape[1]))
    dx[:, ::stride, ::stride, :] = rows.view(n, grad.shape[2], grad.shape[3], x.shape[1])
    return dx.permute(0, 3, 1, 2)


@conv1x1_input_grad.register_fake
def _(grad, x, weight, stride):  # noqa: ANN001, ANN202
    return torch.empty_like(x)


@torch.library.custom_op("profilednn::conv1x1_weight_grad", mutates_args=())
def conv1x1_weight_grad(grad: torch.Tensor, x: torch.Tensor, stride: int) -> torch.Tensor:
    """The weight gradient ``[out, in, 1, 1]`` of a 1x1 convolution: ``dY^T X`` as one GEMM,
    X taken at the output's positions (every ``stride``-th row and column)."""
    if stride != 1:
        x = x[:, :, ::stride, ::stride]
    return torch.mm(_rows(grad).t(), _rows(x)).view(grad.shape[1], x.shape[1], 1, 1)


@conv1x1_weight_grad.register_fake
def _(grad, x, stride):  # noqa: ANN001, ANN202
    return grad.new_empty(grad.shape[1], x.shape[1], 1, 1)


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
    gx = gw = None
    if not _nhwc(x):  # NCHW activations would be transposed first: stock, in one call, is cheaper
        if need_x or need_w:
            gx, gw, _ = torch.ops.aten.convolution_backward(grad, x, weight, None, [s, s], [0, 0], [1, 1], False,
                                                            [0, 0], 1, [need_x, need_w, False])
    else:
        gx = conv1x1_input_grad(grad, x, weight, s) if need_x else None
        gw = conv1x1_weight_grad(grad, x, s) if need_w else None
    gb = grad.sum((0, 2, 3)) if need_b else None
    return gx, gw, gb, None


conv1x1.register_autograd(_backward, setup_context=_setup_context)


# FLOPs as ``torch.utils.flop_counter`` counts the convolutions they are: model FLOPs (MFU)
# must not depend on which kernel ran them. Each: 2 (N H' W') Cout Cin.
@register_flop_formula(torch.ops.profilednn.conv1x1)
def _conv1x1_flops(x_shape: Any, w_shape: Any, bias_shape: Any, stride: int, *, out_shape: Any,
                   **kwargs: Any) -> int:
    return 2 * math.prod(out_shape) * int(w_shape[1])


@register_flop_formula(torch.ops.profilednn.conv1x1_input_grad)
def _input_grad_flops(grad_shape: Any, x_shape: Any, w_shape: Any, stride: int, *, out_shape: Any,
                      **kwargs: Any) -> int:
    return 2 * math.prod(grad_shape) * int(w_shape[1])


@register_flop_formula(torch.ops.profilednn.conv1x1_weight_grad)
def _weight_grad_flops(grad_shape: Any, x_shape: Any, stride: int, *, out_shape: Any, **kwargs: Any) -> int:
    return 2 * math.prod(grad_shape) * int(x_shape[1])


def eligible(conv: nn.Module) -> bool:
    """Whether ``conv`` is a plain ``nn.Conv2d`` that is one GEMM: 1x1, no padding,
    dilation 1, one group, the same stride both ways."""
    return (type(conv) is nn.Conv2d and conv.kernel_size == (1, 1) and conv.groups == 1
            and tuple(conv.padding) == (0, 0) and conv.dilation == (1, 1) and conv.stride[0] == conv.stride[1])


def applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the ops take these tensors (else ``nn.Conv2d``'s own forward runs)."""
    return (x.device.type == "cpu" and weight.device.type == "cpu" and x.dim() == 4
            and x.dtype in VALUE_DTYPES and weight.dtype in VALUE_DTYPES and x.numel() > 0)


class PointwiseGemmConv2d(KeyedOnKernels, nn.Conv2d):
    """A 1x1 ``nn.Conv2d`` computed as GEMMs over channels_last rows in training (forward,
    input and weight gradients); same parameters, buffers and state dict as the
    convolution it replaces (``from_conv`` shares them)."""

    @classmethod
    def from_conv(cls, conv: nn.Conv2d) -> "PointwiseGemmConv2d":
        """The module for ``conv`` (``eligible`` must hold), sharing its parameters."""
        if not eligible(conv):
            raise ValueError(f"not a 1x1 convolution without padding, dilation or groups: {conv}")
        return sharing_tensors(cls, conv)

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
class PointwiseSummary:
    """What ``pointwise_gemms`` did: the convolutions swapped, by name, and how many
    convolutions stayed stock (not 1x1, padded, grouped, dilated)."""

    swapped: list[str] = field(default_factory=list)
    other_convolutions: int = 0

    def describe(self) -> str:
        return (f"{len(self.swapped)} 1x1 Conv2d -> PointwiseGemmConv2d (forward, input and weight gradients "
                f"as GEMMs on channels_last rows); {self.other_convolutions} other convolutions stay stock")


def pointwise_gemms(model: nn.Module) -> tuple[nn.Module, PointwiseSummary]:
    """``model`` with every eligible ``nn.Conv2d`` swapped in place for a
    ``PointwiseGemmConv2d`` sharing its parameters (an optimizer built on the model keeps
    working; state dict keys are unchanged)."""
    summary = PointwiseSummary()
    for parent_name, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            if eligible(child):
                setattr(parent, name, PointwiseGemmConv2d.from_conv(child))
                summary.swapped.append(f"{parent_name}.{name}" if parent_name else name)
            elif isinstance(child, nn.Conv2d) and type(child) is not PointwiseGemmConv2d:
                summary.other_convolutions += 1
    return model, summary


__all__ = ["PointwiseGemmConv2d", "PointwiseSummary", "applies", "conv1x1", "conv1x1_input_grad",
           "conv1x1_weight_grad", "eligible", "pointwise_gemms"]

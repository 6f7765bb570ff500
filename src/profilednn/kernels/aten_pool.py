"""Max pooling that ``torch.compile`` leaves to ATen's own kernels.

TorchInductor generates its own CPU code for ``max_pool2d_with_indices`` and lowers its
backward to a ``scatter_reduce_`` plus a generated loop. On a 2-core Xeon with AMX, ResNet-50's
stem pool ([16, 64, 112, 112], BF16, channels_last, 3x3 stride 2) took 44 ms forward and
backward compiled against 13 ms in eager ATen, which has a vectorised channels_last kernel
for both directions; in the compiled BF16 ResNet-50 step that pool cost ~70 ms, more than
the rest of the compiled code saved.

``AtenMaxPool2d`` is an ``nn.MaxPool2d`` (same arguments, no parameters) whose forward calls
the custom op ``profilednn::max_pool2d``: ATen's ``max_pool2d_with_indices`` forward and
``max_pool2d_with_indices_backward`` backward (``profilednn::max_pool2d_backward``), both
opaque to ``torch.compile`` (``torch.library``),
so the graph around it compiles and the pool runs ATen's kernels. ``keep_aten_pools(model)``
swaps every ``nn.MaxPool2d`` in place; the ``torch_compile`` recipe does it before compiling.
Eager, it computes exactly what ``nn.MaxPool2d`` does.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.modules.utils import _pair

from .compile_cache import KeyedOnKernels


@torch.library.custom_op("profilednn::max_pool2d", mutates_args=())
def max_pool2d(x: torch.Tensor, kernel_size: list[int], stride: list[int], padding: list[int],
               dilation: list[int], ceil_mode: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) of ATen's ``max_pool2d_with_indices``."""
    return torch.ops.aten.max_pool2d_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode)


@max_pool2d.register_fake
def _(x, kernel_size, stride, padding, dilation, ceil_mode):  # noqa: ANN001, ANN202 - the op's own signature
    return torch.ops.aten.max_pool2d_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode)


@torch.library.custom_op("profilednn::max_pool2d_backward", mutates_args=())
def max_pool2d_backward(grad: torch.Tensor, x: torch.Tensor, indices: torch.Tensor, kernel_size: list[int],
                        stride: list[int], padding: list[int], dilation: list[int], ceil_mode: bool) -> torch.Tensor:
    """The input gradient: ATen's ``max_pool2d_with_indices_backward`` (its own op, so that
    the compiled backward keeps it rather than lowering it to a scatter)."""
    return torch.ops.aten.max_pool2d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation,
                                                           ceil_mode, indices)


@max_pool2d_backward.register_fake
def _(grad, x, indices, kernel_size, stride, padding, dilation, ceil_mode):  # noqa: ANN001, ANN202
    return torch.empty_like(x)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, torch.Tensor]) -> None:
    x, kernel_size, stride, padding, dilation, ceil_mode = inputs
    ctx.save_for_backward(x, output[1])
    ctx.args = (kernel_size, stride, padding, dilation, ceil_mode)
    ctx.mark_non_differentiable(output[1])


def _backward(ctx: Any, grad: torch.Tensor, _grad_indices: Any) -> tuple[Any, ...]:
    x, indices = ctx.saved_tensors
    kernel_size, stride, padding, dilation, ceil_mode = ctx.args
    dx = max_pool2d_backward(grad, x, indices, kernel_size, stride, padding, dilation, ceil_mode)
    return dx, None, None, None, None, None


max_pool2d.register_autograd(_backward, setup_context=_setup_context)


class AtenMaxPool2d(KeyedOnKernels, nn.MaxPool2d):
    """``nn.MaxPool2d`` through ``profilednn::max_pool2d`` (ATen's kernels, opaque to
    ``torch.compile``) for batched 4-D CPU inputs; anything else (``return_indices``,
    unbatched inputs, other devices) runs ``nn.MaxPool2d``'s own forward."""

    @classmethod
    def from_pool(cls, pool: nn.MaxPool2d) -> "AtenMaxPool2d":
        """The same pooling as ``pool`` (its arguments copied; a pool has no state)."""
        return cls(pool.kernel_size, pool.stride, pool.padding, pool.dilation, pool.return_indices, pool.ceil_mode)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        if self.return_indices or x.dim() != 4 or x.device.type != "cpu":
            return super().forward(x)
        stride = self.stride if self.stride else self.kernel_size  # None means the kernel size, as in F
        y, _ = max_pool2d(x, list(_pair(self.kernel_size)), list(_pair(stride)), list(_pair(self.padding)),
                          list(_pair(self.dilation)), bool(self.ceil_mode))
        return y


def keep_aten_pools(model: nn.Module) -> list[str]:
    """Swap every ``nn.MaxPool2d`` in ``model`` for an ``AtenMaxPool2d`` in place; the
    names of the pools swapped."""
    swapped = []
    for parent_name, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.MaxPool2d:
                setattr(parent, name, AtenMaxPool2d.from_pool(child))
                swapped.append(f"{parent_name}.{name}" if parent_name else name)
    return swapped


__all__ = ["AtenMaxPool2d", "keep_aten_pools", "max_pool2d", "max_pool2d_backward"]

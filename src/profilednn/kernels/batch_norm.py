"""Training-mode batch norm with the residual add and ReLU fused: one C kernel
(``batch_norm.c``) for the forward and one for the backward.

Stock PyTorch on a CPU runs a ResNet block's tail as separate kernels (batch norm, the
residual add, ReLU, and each one's backward), every one a full pass over an activation, and
its BF16 channels-last batch norm converts through fp32 scratch tensors. On a 2-core Xeon
with AMX, once BF16 and channels_last had made the convolutions fast, those memory-bound
passes took half of ResNet-50's step. The kernels here read and write only what the
mathematics needs (see ``batch_norm.c``).

``batch_norm_act(x, weight, bias, running_mean, running_var, momentum, eps, residual=None,
relu=False)`` computes ``relu(batch_norm(x) + residual)`` with batch statistics and updates
the running statistics as ``nn.BatchNorm2d`` does. It is registered as the custom ops
``profilednn::bn_act_forward`` / ``profilednn::bn_act_backward`` (``torch.library``), so
``torch.compile`` keeps it as one opaque call instead of breaking the graph. It applies to
4-D fp32 or bf16 CPU tensors, contiguous or channels_last, with fp32 (or absent) affine
parameters; ``FusedBatchNorm2d`` falls back to stock ``F.batch_norm`` everywhere else
(evaluation mode, other dtypes or devices) and where no C compiler is available.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from .bindings import SOURCE_DIR
from .compile_cache import KeyedOnKernels
from .build import NativeKernelUnavailable, load
from .sharing import sharing_tensors

BATCH_NORM_SOURCE = SOURCE_DIR / "batch_norm.c"
VALUE_DTYPES = (torch.float32, torch.bfloat16)


@functools.lru_cache(maxsize=None)
def batch_norm_kernel() -> ctypes.CDLL:
    """The fused batch-norm passes, built and loaded on first use; raises
    ``NativeKernelUnavailable`` where they cannot be."""
    lib = load(BATCH_NORM_SOURCE)
    p, i64, f, i = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
    lib.profilednn_bn_forward.argtypes = [i, i64, i64, i64, p, p, p, i, p, p, f, i, p, p, p, i]
    lib.profilednn_bn_forward.restype = i
    lib.profilednn_bn_backward.argtypes = [i, i64, i64, i64, p, p, p, i, p, p, p, p, i, p, p, p, p, i]
    lib.profilednn_bn_backward.restype = i
    return lib


def native_available() -> bool:
    """Whether the C kernels build and load here."""
    try:
        batch_norm_kernel()
    except NativeKernelUnavailable:
        return False
    return True


def _layout(x: torch.Tensor) -> int:
    """1 for channels_last (NHWC rows of C), 0 for contiguous NCHW."""
    return 1 if not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last) else 0


def _like(t: torch.Tensor | None, nhwc: int) -> torch.Tensor | None:
    if t is None:
        return None
    fmt = torch.channels_last if nhwc else torch.contiguous_format
    return t.contiguous(memory_format=fmt)


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _dims(x: torch.Tensor) -> tuple[int, int, int]:
    n, c, h, w = x.shape
    return n, c, h * w


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise MemoryError(f"profilednn batch-norm {what}: the kernel could not allocate its scratch memory")


@torch.library.custom_op("profilednn::bn_act_forward", mutates_args=())
def bn_act_forward(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None,
                   bias: torch.Tensor | None, eps: float, relu: bool
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, mean, invstd, biased var) of ``relu(bn(x) + residual)`` with batch statistics."""
    nhwc = _layout(x)
    x = _like(x, nhwc)
    residual = _like(residual, nhwc)
    y = torch.empty_like(x)
    c = x.shape[1]
    mean, invstd, var = (torch.empty(c, dtype=torch.float32) for _ in range(3))
    rc = batch_norm_kernel().profilednn_bn_forward(
        nhwc, *_dims(x), x.data_ptr(), _ptr(residual), y.data_ptr(), int(x.dtype == torch.bfloat16),
        _ptr(weight), _ptr(bias), float(eps), int(relu), mean.data_ptr(), invstd.data_ptr(), var.data_ptr(),
        torch.get_num_threads())
    _check(rc, "forward")
    return y, mean, invstd, var


@bn_act_forward.register_fake
def _(x, residual, weight, bias, eps, relu):  # noqa: ANN001, ANN202 - the op's own signature
    c = x.shape[1]
    return (torch.empty_like(x), x.new_empty(c, dtype=torch.float32), x.new_empty(c, dtype=torch.float32),
            x.new_empty(c, dtype=torch.float32))


@torch.library.custom_op("profilednn::bn_act_backward", mutates_args=())
def bn_act_backward(grad: torch.Tensor, x: torch.Tensor, y: torch.Tensor | None, weight: torch.Tensor | None,
                    bias: torch.Tensor | None, mean: torch.Tensor, invstd: torch.Tensor, relu: bool,
                    residual_grad: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dresidual, dweight, dbias); dresidual is empty when no residual was added. ``y``
    (the forward's output) is needed only for a ReLU after a residual add."""
    nhwc = _layout(x)
    x = _like(x, nhwc)
    grad = _like(grad.to(x.dtype), nhwc)
    y = _like(y, nhwc)
    dx = torch.empty_like(x)
    dz = torch.empty_like(x) if residual_grad else x.new_empty(0)
    c = x.shape[1]
    dw, db = torch.empty(c, dtype=torch.float32), torch.empty(c, dtype=torch.float32)
    rc = batch_norm_kernel().profilednn_bn_backward(
        nhwc, *_dims(x), grad.data_ptr(), x.data_ptr(), _ptr(y), int(x.dtype == torch.bfloat16),
        _ptr(weight), _ptr(bias), mean.data_ptr(), invstd.data_ptr(), int(relu), dx.data_ptr(),
        dz.data_ptr() if residual_grad else None, dw.data_ptr(), db.data_ptr(), torch.get_num_threads())
    _check(rc, "backward")
    return dx, dz, dw, db


@bn_act_backward.register_fake
def _(grad, x, y, weight, bias, mean, invstd, relu, residual_grad):  # noqa: ANN001, ANN202
    c = x.shape[1]
    return (torch.empty_like(x), torch.empty_like(x) if residual_grad else x.new_empty(0),
            x.new_empty(c, dtype=torch.float32), x.new_empty(c, dtype=torch.float32))


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Any, ...]) -> None:
    x, residual, weight, bias, _eps, relu = inputs
    y, mean, invstd, _var = output
    keep_y = relu and residual is not None  # the ReLU mask cannot be recomputed from x then
    ctx.save_for_backward(x, y if keep_y else None, weight, bias, mean, invstd)
    ctx.relu = relu
    ctx.residual = residual is not None
    ctx.affine = (weight is not None and weight.requires_grad, bias is not None and bias.requires_grad)


def _backward(ctx: Any, grad_y: torch.Tensor, *_unused: Any) -> tuple[Any, ...]:
    x, y, weight, bias, mean, invstd = ctx.saved_tensors
    dx, dz, dw, db = bn_act_backward(grad_y, x, y, weight, bias, mean, invstd, ctx.relu, ctx.residual)
    return (dx, dz if ctx.residual else None, dw if ctx.affine[0] else None, db if ctx.affine[1] else None,
            None, None)


bn_act_forward.register_autograd(_backward, setup_context=_setup_context)


def applies(x: torch.Tensor, weight: torch.Tensor | None, residual: torch.Tensor | None = None) -> bool:
    """Whether the fused kernels take these tensors (else stock PyTorch does); whether the
    kernels build here is ``native_available()``."""
    if x.device.type != "cpu" or x.dim() != 4 or x.dtype not in VALUE_DTYPES or x.numel() == 0:
        return False
    if weight is not None and (weight.dtype != torch.float32 or weight.device.type != "cpu"):
        return False
    return residual is None or (residual.shape == x.shape and residual.dtype == x.dtype)


def batch_norm_act(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                   running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
                   momentum: float, eps: float, residual: torch.Tensor | None = None,
                   relu: bool = False) -> torch.Tensor:
    """``relu(batch_norm(x, training=True) + residual)``; running statistics (when given)
    updated in place as ``F.batch_norm`` does: ``(1 - momentum) r + momentum s`` with the
    unbiased variance."""
    y, mean, _invstd, var = bn_act_forward(x, residual, weight, bias, eps, relu)
    if running_mean is not None and running_var is not None:
        n = x.numel() // x.shape[1]
        with torch.no_grad():
            running_mean.mul_(1.0 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
            running_var.mul_(1.0 - momentum).add_(var.to(running_var.dtype), alpha=momentum * n / max(n - 1, 1))
    return y


class FusedBatchNorm2d(KeyedOnKernels, nn.BatchNorm2d):
    """``nn.BatchNorm2d`` whose training forward runs the fused C kernels (same parameters,
    buffers and state dict); with ``relu=True`` it also applies the ReLU that followed it.

    Evaluation mode, inputs the kernels do not take (see ``applies``) and a machine without a
    C compiler run stock ``F.batch_norm`` (then ReLU), so the module is always correct.
    """

    def __init__(self, *args: Any, relu: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.relu = relu
        self.native = native_available()  # asked once here, never inside a (traced) forward

    @classmethod
    def from_batch_norm(cls, bn: nn.BatchNorm2d, relu: bool = False) -> "FusedBatchNorm2d":
        """A fused module sharing ``bn``'s parameters and buffers (no copy)."""
        fused = sharing_tensors(cls, bn)
        fused.relu = relu
        fused.native = native_available()
        return fused

    def extra_repr(self) -> str:
        return super().extra_repr() + (", relu=True" if self.relu else "")

    def _momentum(self) -> float:
        if self.momentum is not None:
            return float(self.momentum)
        return 1.0 / float(self.num_batches_tracked)  # cumulative moving average

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:  # type: ignore[override]
        use_batch_stats = self.training or not self.track_running_stats
        if use_batch_stats and self.native and applies(x, self.weight, residual):
            if self.training and self.track_running_stats and self.num_batches_tracked is not None:
                self.num_batches_tracked.add_(1)
            track = self.training and self.track_running_stats
            return batch_norm_act(x, self.weight, self.bias, self.running_mean if track else None,
                                  self.running_var if track else None, self._momentum() if track else 0.0,
                                  self.eps, residual, self.relu)
        out = super().forward(x)
        if residual is not None:
            out = out + residual
        return F.relu(out) if self.relu else out


__all__ = ["BATCH_NORM_SOURCE", "FusedBatchNorm2d", "applies", "batch_norm_act", "batch_norm_kernel",
           "native_available"]

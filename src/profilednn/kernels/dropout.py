"""Dropout whose mask is drawn by a counter-based generator in the same pass that applies it
(``dropout.c``), and regenerated, not stored, for the backward.

Stock PyTorch on a CPU draws dropout's mask with ``bernoulli_``, one number at a time from
the global Mersenne-Twister generator, then divides and multiplies in further passes and
keeps the mask for the backward. In bert_base's BF16 step on a 2-core Xeon with AMX that
was 403 ms of 1,656. Here ``y = x * mask / (1 - p)`` is one vectorised read and write, the
mask a pure function of (seed, offset, index) through Philox-4x32-10, so the backward
``dx = dy * mask / (1 - p)`` is the same pass on ``dy`` with the forward's seed.

The seed (63 bits) is drawn from torch's default generator at each call, so
``torch.manual_seed`` makes a run reproducible; the random stream is not stock's (the masks
differ from ``nn.Dropout``'s for the same seed), and the keep rate is 1 - p to 2**-32.
The ops are ``profilednn::dropout_forward`` (tagged ``nondeterministic_seeded``: a compiler
neither merges two calls nor drops one) and ``profilednn::dropout_backward``, registered
with ``torch.library`` (fake impls, autograd), so ``torch.compile`` keeps each one whole and
eager and compiled runs draw the same masks. fp32 and bf16 CPU tensors of any layout (the
mask follows the logical, row-major index; the output is contiguous); other dtypes or
devices, and machines without a C compiler, run stock ``F.dropout``.
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

DROPOUT_SOURCE = SOURCE_DIR / "dropout.c"
VALUE_DTYPES = (torch.float32, torch.bfloat16)


@functools.lru_cache(maxsize=None)
def dropout_kernel() -> ctypes.CDLL:
    """The fused dropout pass, built and loaded on first use; raises
    ``NativeKernelUnavailable`` where it cannot be."""
    lib = load(DROPOUT_SOURCE)
    p = ctypes.c_void_p
    lib.profilednn_dropout.argtypes = [ctypes.c_int64, p, p, ctypes.c_int, ctypes.c_uint32, ctypes.c_float,
                                       ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int]
    lib.profilednn_dropout.restype = None
    return lib


def native_available() -> bool:
    """Whether the C kernel builds and loads here."""
    try:
        dropout_kernel()
    except NativeKernelUnavailable:
        return False
    return True


def threshold(p: float) -> int:
    """The 32-bit threshold below which a word drops its element: round(p 2**32)."""
    return min(max(round(p * 2.0**32), 0), 2**32 - 1)


def apply_mask(values: torch.Tensor, p: float, seed: int, offset: int = 0) -> torch.Tensor:
    """``values * mask(seed, offset) / (1 - p)`` (0 < p < 1), as a new contiguous tensor: the
    pass both ops run (the forward on x, the backward on the incoming gradient)."""
    values = values.contiguous()
    out = torch.empty_like(values)
    dropout_kernel().profilednn_dropout(values.numel(), values.data_ptr(), out.data_ptr(),
                                        int(values.dtype == torch.bfloat16), threshold(p), 1.0 / (1.0 - p),
                                        seed, offset, torch.get_num_threads())
    return out


def draw_seed() -> torch.Tensor:
    """A 63-bit seed from torch's default CPU generator (an int64 scalar tensor)."""
    return torch.empty((), dtype=torch.int64).random_()


@torch.library.custom_op("profilednn::dropout_forward", mutates_args=(),
                         tags=(torch.Tag.nondeterministic_seeded,))
def dropout_forward(x: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, seed): ``y = x * mask / (1 - p)`` with a mask drawn from a fresh seed."""
    seed = draw_seed()
    return apply_mask(x, p, int(seed)), seed


@dropout_forward.register_fake
def _(x, p):  # noqa: ANN001, ANN202 - the op's own signature
    return torch.empty_like(x, memory_format=torch.contiguous_format), x.new_empty((), dtype=torch.int64)


@torch.library.custom_op("profilednn::dropout_backward", mutates_args=())
def dropout_backward(grad: torch.Tensor, seed: torch.Tensor, p: float) -> torch.Tensor:
    """``grad * mask / (1 - p)`` with the forward's mask, regenerated from its seed."""
    return apply_mask(grad, p, int(seed))


@dropout_backward.register_fake
def _(grad, seed, p):  # noqa: ANN001, ANN202
    return torch.empty_like(grad, memory_format=torch.contiguous_format)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Any, ...]) -> None:
    x, p = inputs
    ctx.save_for_backward(output[1])
    ctx.p = p
    ctx.dtype = x.dtype


def _backward(ctx: Any, grad_y: torch.Tensor, _grad_seed: Any) -> tuple[Any, ...]:
    (seed,) = ctx.saved_tensors
    return dropout_backward(grad_y.to(ctx.dtype), seed, ctx.p), None


dropout_forward.register_autograd(_backward, setup_context=_setup_context)


def applies(x: torch.Tensor) -> bool:
    """Whether the kernel takes ``x`` (else stock ``F.dropout`` does); whether it builds here
    is ``native_available()``."""
    return x.device.type == "cpu" and x.dtype in VALUE_DTYPES and x.numel() > 0


def fused_dropout(x: torch.Tensor, p: float = 0.5, training: bool = True, *, native: bool = True) -> torch.Tensor:
    """``F.dropout(x, p, training)`` with the fused kernel's mask (see the module doc).
    ``native=False`` (or a tensor the kernel does not take) runs stock ``F.dropout``."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return x * 0.0  # as stock: zeros (NaN stays NaN), gradient zero
    if not (native and applies(x)):
        return F.dropout(x, p, True)
    return dropout_forward(x, p)[0]


class FusedDropout(KeyedOnKernels, nn.Dropout):
    """``nn.Dropout`` (same ``p``, same state) whose training forward runs the fused kernel.

    Evaluation mode and ``p = 0`` return the input itself, ``p = 1`` zeros; ``inplace`` is
    accepted for compatibility and ignored (the result is a new tensor). Where the kernel
    cannot be built, or for inputs it does not take, stock ``F.dropout`` runs."""

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__(p, inplace)
        self.native = native_available()  # asked once here, never inside a (traced) forward

    @classmethod
    def from_dropout(cls, module: nn.Dropout) -> "FusedDropout":
        """A fused module with ``module``'s probability and training mode."""
        fused = cls(module.p, module.inplace)
        fused.train(module.training)
        return fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused_dropout(x, self.p, self.training, native=self.native)


__all__ = ["DROPOUT_SOURCE", "FusedDropout", "apply_mask", "applies", "draw_seed", "dropout_backward",
           "dropout_forward", "dropout_kernel", "fused_dropout", "native_available", "threshold"]

"""The ctypes bindings of this package's C kernels: the fused focal loss (``focal_loss.c``)
and the fused LAMB step (``lamb.c``), each built once per machine into
``<cache>/kernels/`` by ``build.py`` and loaded on first use."""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

from .build import load

SOURCE_DIR = Path(__file__).resolve().parent
FOCAL_LOSS_SOURCE = SOURCE_DIR / "focal_loss.c"
LAMB_SOURCE = SOURCE_DIR / "lamb.c"


@functools.lru_cache(maxsize=None)
def focal_loss_kernel() -> ctypes.CDLL:
    """The fused focal-loss pass, built and loaded on first use (``profilednn_focal_loss``,
    ``profilednn_focal_loss_blocks``); raises ``NativeKernelUnavailable`` where it cannot be."""
    lib = load(FOCAL_LOSS_SOURCE)
    fn = lib.profilednn_focal_loss
    ptr, f = ctypes.c_void_p, ctypes.c_float
    fn.argtypes = [ctypes.c_int64, ptr, ptr, ctypes.c_int, f, f, f, ptr, ptr, ptr, ctypes.c_int]
    fn.restype = None
    blocks = lib.profilednn_focal_loss_blocks
    blocks.argtypes = [ctypes.c_int64]
    blocks.restype = ctypes.c_int64
    return lib


@functools.lru_cache(maxsize=None)
def lamb_kernel() -> ctypes.CDLL:
    """The fused LAMB step, built and loaded on first use (``profilednn_lamb_step_f32``);
    raises ``NativeKernelUnavailable`` where it cannot be."""
    lib = load(LAMB_SOURCE)
    fn = lib.profilednn_lamb_step_f32
    ptrs = ctypes.POINTER(ctypes.c_void_p)
    f = ctypes.c_float
    fn.argtypes = [ctypes.c_int64, ptrs, ptrs, ptrs, ptrs, ctypes.POINTER(ctypes.c_int64),
                   f, f, f, f, f, f, f, f, f, ctypes.c_int]
    fn.restype = None
    return lib


__all__ = ["FOCAL_LOSS_SOURCE", "LAMB_SOURCE", "SOURCE_DIR", "focal_loss_kernel", "lamb_kernel"]

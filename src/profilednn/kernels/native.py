"""The fused focal loss in C (``focal_loss.c``): built once per machine into
``<cache>/kernels/`` and loaded with ctypes by ``profilednn.native``."""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

from .. import native

FOCAL_LOSS_SOURCE = Path(__file__).resolve().parent / "focal_loss.c"


@functools.lru_cache(maxsize=None)
def focal_loss_kernel() -> ctypes.CDLL:
    """The fused focal-loss pass, built and loaded on first use (``profilednn_focal_loss``,
    ``profilednn_focal_loss_blocks``); raises ``NativeKernelUnavailable`` where it cannot be."""
    lib = native.load(FOCAL_LOSS_SOURCE)
    fn = lib.profilednn_focal_loss
    ptr, f = ctypes.c_void_p, ctypes.c_float
    fn.argtypes = [ctypes.c_int64, ptr, ptr, ctypes.c_int, f, f, f, ptr, ptr, ptr, ctypes.c_int]
    fn.restype = None
    blocks = lib.profilednn_focal_loss_blocks
    blocks.argtypes = [ctypes.c_int64]
    blocks.restype = ctypes.c_int64
    return lib


__all__ = ["FOCAL_LOSS_SOURCE", "focal_loss_kernel"]

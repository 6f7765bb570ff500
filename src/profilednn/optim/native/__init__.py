"""The fused LAMB step in C (``lamb.c``), for which stock PyTorch has no kernel: built once
per machine into ``<cache>/kernels/`` and loaded with ctypes by ``profilednn.native``."""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

from ... import native
from ...native import NativeKernelUnavailable

SOURCE_DIR = Path(__file__).resolve().parent


def build(name: str) -> Path:
    """Compile ``<name>.c`` of this directory into the cache (once) and return its path."""
    return native.build(SOURCE_DIR / f"{name}.c")


@functools.lru_cache(maxsize=None)
def lamb_kernel() -> ctypes.CDLL:
    """The fused LAMB step, built and loaded on first use (``profilednn_lamb_step_f32``)."""
    lib = native.load(SOURCE_DIR / "lamb.c")
    fn = lib.profilednn_lamb_step_f32
    ptrs = ctypes.POINTER(ctypes.c_void_p)
    f = ctypes.c_float
    fn.argtypes = [ctypes.c_int64, ptrs, ptrs, ptrs, ptrs, ctypes.POINTER(ctypes.c_int64),
                   f, f, f, f, f, f, f, f, f, ctypes.c_int]
    fn.restype = None
    return lib


__all__ = ["NativeKernelUnavailable", "build", "lamb_kernel"]

"""Recycled output buffers for the native kernels.

A fresh 254 MB gradient (RetinaNet's 2x120087x264 fp32 focal-loss logits) arrives from the
OS unmapped: its first write costs ~62,000 page faults, each zeroing a page that the kernel
then overwrites, about as long as the pass itself, and it varies with the OS's memory state.
``GradientPool`` keeps a few such buffers and hands one out again only when no tensor but
the pool's own references its storage, i.e. once the gradient it last held was dropped
(autograd consumed it, ``zero_grad`` set ``.grad`` to None). A gradient the user still
holds is never written to: while any tensor views the storage, the buffer is busy.
"""

from __future__ import annotations

import math
import threading

import torch

# torch's storage reference count (a private but long-standing binding); without it
# nothing is recycled and every call allocates, as stock PyTorch does.
_use_count = getattr(torch._C, "_storage_Use_Count", None)


class GradientPool:
    """At most ``capacity`` recycled 1-D buffers, most recently used last (2: a training step
    holds one or two focal-loss gradients at a time, e.g. torchvision's RetinaNet calls the
    loss once per image)."""

    def __init__(self, capacity: int = 2) -> None:
        self.capacity = capacity
        self._buffers: list[torch.Tensor] = []
        self._lock = threading.Lock()

    @staticmethod
    def _is_free(buf: torch.Tensor) -> bool:
        # 2 references: the pool's tensor and the temporary storage object of this call
        return _use_count is not None and _use_count(buf.untyped_storage()._cdata) == 2

    def take(self, shape: torch.Size | tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised contiguous CPU tensor of ``shape`` and ``dtype``: a view of a
        recycled buffer nobody else references (at most twice the size asked for), else of a
        newly allocated one."""
        n = math.prod(shape)
        with self._lock:  # the free test and the hand-out must not interleave across threads
            for i, buf in enumerate(self._buffers):
                if buf.dtype == dtype and n <= buf.numel() <= 2 * n + 1 and self._is_free(buf):
                    self._buffers.append(self._buffers.pop(i))
                    return buf[:n].view(shape)
            buf = torch.empty(n, dtype=dtype)
            view = buf[:n].view(shape)
            if _use_count is not None and n > 0:
                self._buffers.append(buf)
                if len(self._buffers) > self.capacity:
                    self._evict()
            return view

    def _evict(self) -> None:
        """Drop the least recently used buffer (a busy one lives on with its user)."""
        self._buffers.pop(0)

    def release(self) -> int:
        """Forget every buffer (memory returns to the OS once no gradient views it);
        returns how many were held."""
        with self._lock:
            held = len(self._buffers)
            self._buffers.clear()
            return held

    def held_bytes(self) -> int:
        """Bytes the pool's buffers hold."""
        with self._lock:
            return sum(b.numel() * b.element_size() for b in self._buffers)


__all__ = ["GradientPool"]

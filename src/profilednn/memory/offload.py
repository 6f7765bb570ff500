"""Offload activations saved for backward to host memory, and bring them back ahead of need.

Built on ``torch.autograd.graph.saved_tensors_hooks``::

    with offload_activations(min_bytes=1 << 20) as off:
        loss = loss_fn(model(x), y)
    loss.backward()
    off.stats   # how many tensors/bytes went to the host, prefetch hits and misses

What happens to each tensor autograd saves during the forward:

- parameters (and views of them), and tensors smaller than ``min_bytes``, stay where they
  are: they cost little, or they live anyway;
- the rest are copied to host memory and the device copy is dropped (autograd keeps only
  the handle). On an accelerator the host buffer is pinned and the copy is asynchronous on
  a side stream (the side stream first waits for the compute stream; ``record_stream``
  keeps the caching allocator from reusing the source block before the copy ends);
- the same tensor saved twice (a ReLU's output that the next pool saves again) is copied
  once, recognised by its view (storage address, offset, shape, strides, dtype) while the
  original tensor object is still alive (a weak reference: a freed block's address can be
  reused by a new tensor).

During backward each request unpacks its tensor and, on an accelerator, starts the
host-to-device copies of the next ``prefetch`` tensors in reverse order of saving (the
order backward needs them) on the side stream, so the copy overlaps the compute of the
current layer; a request that finds its tensor not yet fetched copies it then (a miss).

On a CPU, "device" and "host" are the same memory: the tensor is still really copied
into a separate host buffer and the original dropped, so the mechanism (hooks, views,
dedup, bit-identical gradients) is exercised and its copy cost measured, but peak memory
cannot drop and there is nothing to prefetch; backward reads the host copy directly.
Stock ``torch.autograd.graph.save_on_cpu`` copies synchronously on the compute stream
and fetches each tensor only when backward asks for it.

Each offloaded tensor is released once backward has used it, so a graph offloaded this
way supports a single backward (not ``retain_graph=True``).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import ProfileDNNError

DEFAULT_MIN_BYTES = 256 * 1024


@dataclass
class OffloadStats:
    """Counters of one offloading context (updated live). ``kept``: activations left on the
    device (under ``min_bytes``); ``weights``: parameters/buffers saved (never moved)."""

    packed: int = 0
    offloaded: int = 0
    deduplicated: int = 0
    kept: int = 0
    weights: int = 0
    offloaded_bytes: int = 0
    kept_bytes: int = 0
    prefetched: int = 0
    fetched_on_demand: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class _Entry:
    """One offloaded tensor: its host copy and, once fetched, its device copy."""

    index: int
    device: torch.device
    host: torch.Tensor | None
    refs: int = 1
    offloaded: Any = None  # event: host copy complete (accelerator only)
    fetched: torch.Tensor | None = None
    ready: Any = None  # event: device copy complete (accelerator only)
    released: bool = False
    source: Any = None  # weak reference to the tensor it copies: dedup only while it lives


@dataclass
class _Kept:
    tensor: torch.Tensor


def _view_key(t: torch.Tensor) -> tuple[Any, ...]:
    return (str(t.device), t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape),
            tuple(t.stride()), t.dtype)


def _is_weight(t: torch.Tensor) -> bool:
    if isinstance(t, nn.Parameter) or (t.is_leaf and t.requires_grad):
        return True
    base = t._base
    return base is not None and base.is_leaf and base.requires_grad


class ActivationOffloader:
    """The context manager ``offload_activations`` returns; see the module docstring."""

    def __init__(
        self,
        min_bytes: int = DEFAULT_MIN_BYTES,
        prefetch: int = 2,
        pin_memory: bool | None = None,
        model: nn.Module | None = None,
        max_bytes: int | None = None,
    ) -> None:
        if min_bytes < 0:
            raise ProfileDNNError(f"min_bytes must be >= 0, not {min_bytes}")
        if prefetch < 0:
            raise ProfileDNNError(f"prefetch must be >= 0, not {prefetch}")
        self.min_bytes = min_bytes
        self.max_bytes = max_bytes
        self.prefetch = prefetch
        self.pin_memory = pin_memory
        self.stats = OffloadStats()
        self._state: set[tuple[str, int]] = set()
        if model is not None:
            self._state = {(str(t.device), t.untyped_storage().data_ptr())
                           for t in [*model.parameters(), *model.buffers()]}
        self._entries: list[_Entry] = []
        self._by_view: dict[tuple[Any, ...], _Entry] = {}
        self._streams: dict[torch.device, Any] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    # -- context --------------------------------------------------------------------------
    def __enter__(self) -> "ActivationOffloader":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)
        self._by_view.clear()  # a new forward in another context must not reuse these

    # -- helpers --------------------------------------------------------------------------
    def _side_stream(self, device: torch.device) -> Any:
        if device not in self._streams:
            self._streams[device] = torch.get_device_module(device).Stream(device=device)
        return self._streams[device]

    def _keep(self, t: torch.Tensor) -> _Kept:
        self.stats.kept += 1
        self.stats.kept_bytes += t.numel() * t.element_size()
        return _Kept(t)

    # -- pack: forward ----------------------------------------------------------------------
    def _pack(self, t: torch.Tensor) -> Any:
        self.stats.packed += 1
        nbytes = t.numel() * t.element_size()
        if _is_weight(t) or (str(t.device), t.untyped_storage().data_ptr()) in self._state:
            self.stats.weights += 1
            return _Kept(t)
        if nbytes < self.min_bytes:
            return self._keep(t)
        if self.max_bytes is not None and self.stats.offloaded_bytes + nbytes > self.max_bytes:
            return self._keep(t)  # over the cap: the rest of the forward stays (backward needs it first)
        key = _view_key(t)
        entry = self._by_view.get(key)
        # Same view of a storage that is still alive: the same data (a freed block's address
        # can be reused by a new tensor, so a dead source never matches).
        if entry is not None and not entry.released and entry.source() is t:
            entry.refs += 1
            self.stats.deduplicated += 1
            return entry
        entry = _Entry(index=len(self._entries), device=t.device, host=None, source=weakref.ref(t))
        if t.device.type == "cpu":
            entry.host = torch.empty_like(t, memory_format=torch.preserve_format)
            entry.host.copy_(t)
        else:
            pin = torch.cuda.is_available() if self.pin_memory is None else self.pin_memory
            module = torch.get_device_module(t.device)
            side = self._side_stream(t.device)
            side.wait_stream(module.current_stream(t.device))
            with module.stream(side):
                entry.host = torch.empty_like(t, device="cpu", pin_memory=pin)
                entry.host.copy_(t, non_blocking=pin)
                entry.offloaded = module.Event()
                entry.offloaded.record(side)
            t.record_stream(side)
        self._entries.append(entry)
        self._by_view[key] = entry
        self.stats.offloaded += 1
        self.stats.offloaded_bytes += nbytes
        return entry

    # -- unpack: backward -------------------------------------------------------------------
    def _fetch(self, entry: _Entry) -> None:
        """Start the host-to-device copy of ``entry`` on the side stream."""
        if entry.fetched is not None or entry.host is None or entry.device.type == "cpu":
            return
        module = torch.get_device_module(entry.device)
        side = self._side_stream(entry.device)
        with module.stream(side):
            if entry.offloaded is not None:
                side.wait_event(entry.offloaded)
            entry.fetched = torch.empty_like(entry.host, device=entry.device)
            entry.fetched.copy_(entry.host, non_blocking=True)
            entry.ready = module.Event()
            entry.ready.record(side)

    def _unpack(self, handle: Any) -> torch.Tensor:
        if isinstance(handle, _Kept):
            return handle.tensor
        entry: _Entry = handle
        if entry.host is None:
            raise ProfileDNNError("an offloaded activation was already used by an earlier backward; "
                                  "offload_activations supports one backward per forward (no retain_graph)")
        if entry.device.type == "cpu":
            out = entry.host
        else:
            module = torch.get_device_module(entry.device)
            if entry.fetched is None:
                self.stats.fetched_on_demand += 1
                self._fetch(entry)
            else:
                self.stats.prefetched += 1
            current = module.current_stream(entry.device)
            current.wait_event(entry.ready)
            out = entry.fetched
            out.record_stream(current)
            # Prefetch the tensors saved just before this one: backward needs them next.
            for other in reversed(self._entries[max(0, entry.index - self.prefetch):entry.index]):
                if not other.released:
                    self._fetch(other)
        entry.refs -= 1
        if entry.refs == 0:
            entry.released = True
            entry.host = None
            entry.fetched = None
        return out


def offload_activations(
    min_bytes: int = DEFAULT_MIN_BYTES,
    prefetch: int = 2,
    pin_memory: bool | None = None,
    model: nn.Module | None = None,
    max_bytes: int | None = None,
) -> ActivationOffloader:
    """A context manager that offloads the activations saved inside it to host memory.

    ``min_bytes``: tensors smaller than this stay on the device. ``prefetch``: how many
    tensors backward fetches ahead (accelerators). ``pin_memory``: pinned host buffers
    (default: when CUDA is available). ``model``: its parameters and buffers are never
    offloaded (without it, leaf tensors that require grad and their views are kept).
    ``max_bytes``: offload at most this much per forward, the earliest tensors first; the
    later ones, which backward needs first, stay (trades memory saved for copy time).
    """
    return ActivationOffloader(min_bytes=min_bytes, prefetch=prefetch, pin_memory=pin_memory, model=model,
                               max_bytes=max_bytes)


__all__ = ["DEFAULT_MIN_BYTES", "ActivationOffloader", "OffloadStats", "offload_activations"]

"""The measured memory peak of one training step.

- Tensor bytes on the CPU: ``torch.profiler`` with ``profile_memory=True`` records every
  allocator call (frees negative); the running sum over the step, on top of the bytes
  already live when it starts (weights, buffers, gradients, optimizer state, the batch),
  gives the peak of live tensor bytes. Module forward spans (``record_function`` from
  hooks) give each layer's *workspace*: how far the running sum rose above where it
  ended inside that layer's forward (temporaries allocated and freed there).
- Process RSS: ``psutil``, sampled every few milliseconds by a thread during the step;
  includes the allocator's cache and everything else the process holds, so it is an
  outer bound, and noisy.
- On an accelerator: ``torch.accelerator.max_memory_allocated`` after a peak reset.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil
import torch
from torch import nn

SPAN_PREFIX = "pdnn_mem_fwd::"


@dataclass
class PeakMeasurement:
    """One step's measured peak (bytes). ``tensor_peak_bytes`` = ``baseline_bytes`` +
    the highest running sum of allocations during the step."""

    device: str
    baseline_bytes: int
    peak_delta_bytes: int
    rss_start_bytes: int
    rss_peak_bytes: int
    accelerator_peak_bytes: int | None = None
    workspace_by_module: dict[str, int] = field(default_factory=dict)

    @property
    def tensor_peak_bytes(self) -> int:
        return self.baseline_bytes + self.peak_delta_bytes

    @property
    def peak_bytes(self) -> int:
        """The peak that matters on this device: accelerator memory there, tensor bytes on a CPU."""
        if self.accelerator_peak_bytes is not None:
            return self.accelerator_peak_bytes
        return self.tensor_peak_bytes


class RssSampler:
    """Sample this process's RSS every ``interval_s`` in a thread; keep the maximum."""

    def __init__(self, interval_s: float = 0.002) -> None:
        self.interval_s = interval_s
        self._proc = psutil.Process()
        self.start = self.peak = self._proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pdnn-rss", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def __enter__(self) -> "RssSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)


def live_bytes(*groups: Any) -> int:
    """Bytes of the unique storages among tensors found in ``groups`` (tensors, modules,
    optimizers, nested lists/tuples/dicts)."""
    seen: dict[tuple[str, int], int] = {}

    def visit(obj: Any) -> None:
        if isinstance(obj, torch.Tensor):
            s = obj.untyped_storage()
            seen[(str(obj.device), s.data_ptr())] = s.nbytes()
        elif isinstance(obj, nn.Module):
            for t in [*obj.parameters(), *obj.buffers()]:
                visit(t)
                if t.grad is not None:
                    visit(t.grad)
        elif isinstance(obj, torch.optim.Optimizer):
            for state in obj.state.values():
                visit(list(state.values()))
        elif isinstance(obj, dict):
            for v in obj.values():
                visit(v)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                visit(v)

    for group in groups:
        visit(group)
    return sum(seen.values())


class _ForwardSpans:
    """``record_function`` spans around each leaf module's forward."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._handles: list[Any] = []
        self._open: dict[int, list[Any]] = {}

    def __enter__(self) -> "_ForwardSpans":
        for name, module in self.model.named_modules():
            if any(True for _ in module.children()):
                continue
            label = SPAN_PREFIX + (name or "(model)")
            self._handles.append(module.register_forward_pre_hook(self._enter(label)))
            self._handles.append(module.register_forward_hook(self._exit, always_call=True))
        return self

    def _enter(self, label: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any) -> None:
            rf = torch.profiler.record_function(label)
            rf.__enter__()
            self._open.setdefault(id(module), []).append(rf)
        return hook

    def _exit(self, module: nn.Module, args: Any, output: Any) -> None:
        stack = self._open.get(id(module))
        if stack:
            stack.pop().__exit__(None, None, None)

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


def _timeline(prof: torch.profiler.profile, device_type: str) -> tuple[list[tuple[int, int]], dict[str, list[tuple[int, int]]]]:
    """(allocator events as (ns, signed bytes) in time order, forward spans per module)."""
    events = prof.profiler.kineto_results.events()  # type: ignore[union-attr]
    allocs: list[tuple[int, int]] = []
    spans: dict[str, list[tuple[int, int]]] = {}
    for e in events:
        name = e.name()
        if name == "[memory]":
            if e.device_type().name.lower() == device_type:
                allocs.append((e.start_ns(), e.nbytes()))
        elif name.startswith(SPAN_PREFIX):
            spans.setdefault(name[len(SPAN_PREFIX):], []).append((e.start_ns(), e.end_ns()))
    allocs.sort()
    return allocs, spans


def _workspace(allocs: list[tuple[int, int]], spans: dict[str, list[tuple[int, int]]]) -> dict[str, int]:
    """Per module: the largest rise of the running sum above its level at the span's end."""
    times = [t for t, _ in allocs]
    running: list[int] = []
    total = 0
    for _, b in allocs:
        total += b
        running.append(total)
    out: dict[str, int] = {}
    for module, ranges in spans.items():
        best = 0
        for start, end in ranges:
            i = bisect.bisect_left(times, start)
            j = bisect.bisect_right(times, end)
            if i >= j:
                continue
            before = running[i - 1] if i > 0 else 0
            window = running[i:j]
            best = max(best, max(window) - max(window[-1], before))
        out[module] = best
    return out


def measure_step_peak(
    step: Callable[[], Any],
    model: nn.Module,
    live: tuple[Any, ...],
    device: torch.device | str = "cpu",
) -> PeakMeasurement:
    """Run ``step()`` once under observation and measure its peak.

    The profiler sees no free of a block allocated before it started, so ``step`` must
    not free pre-existing tensors (zero the gradients with ``set_to_none`` beforehand).
    ``live`` holds what is already in memory when the step starts (the model, optimizer,
    batch): their bytes are the baseline the step's allocations add to.
    """
    from ..capture.stream import quiet_profiler_noise

    device = torch.device(device)
    baseline = live_bytes(*live)
    on_accelerator = device.type != "cpu"
    if on_accelerator:
        torch.accelerator.synchronize()
        torch.accelerator.reset_peak_memory_stats()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with RssSampler() as rss, _ForwardSpans(model):
        with quiet_profiler_noise():
            with torch.profiler.profile(activities=activities, profile_memory=True) as prof:
                step()
                if on_accelerator:
                    torch.accelerator.synchronize()
    accel_peak = int(torch.accelerator.max_memory_allocated()) if on_accelerator else None
    allocs, spans = _timeline(prof, device.type)
    peak = 0
    running = 0
    for _, b in allocs:
        running += b
        peak = max(peak, running)
    return PeakMeasurement(
        device=str(device),
        baseline_bytes=baseline,
        peak_delta_bytes=peak,
        rss_start_bytes=rss.start,
        rss_peak_bytes=rss.peak,
        accelerator_peak_bytes=accel_peak,
        workspace_by_module=_workspace(allocs, spans),
    )


__all__ = ["PeakMeasurement", "RssSampler", "live_bytes", "measure_step_peak"]

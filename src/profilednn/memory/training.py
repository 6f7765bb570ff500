"""The memory job's device handling around the one training state (``TrainStep``).

The memory job measures the same step as every other job; the only additions are the
device (the model is moved before its first step, so the optimizer's state is created
where the weights live; the pool becomes its first batch, on the device, so every measured
step sees identical data already in place) and a context (offloading, counters) around
forward and loss, made afresh for each step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, ContextManager

import torch

from ..errors import InputError
from ..train_step import TrainStep, to_device
from ..workloads import build_workload

AroundForward = Callable[[], ContextManager[Any]]


def resolve_device(name: str | torch.device) -> torch.device:
    """``"cpu"``, ``"cuda:0"``, ... as a device that exists here; InputError naming it if not."""
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as exc:
        raise InputError(f"cannot read {name!r} as a device (write cpu, cuda:0, ...)") from exc
    if device.type == "cpu":
        return device
    module = getattr(torch, device.type, None)
    available = bool(module is not None and getattr(module, "is_available", lambda: False)())
    if not available:
        raise InputError(f"device {device} is not available: this machine has no {device.type.upper()} "
                         "device usable by torch (use cpu)")
    count = module.device_count() if hasattr(module, "device_count") else 1
    index = device.index or 0
    if index >= count:
        raise InputError(f"device {device} is not available: only {count} {device.type} device(s) here")
    return device


def synchronize(device: torch.device) -> None:
    if device.type != "cpu":
        torch.accelerator.synchronize()


def on_device(state: TrainStep, device: torch.device | str = "cpu") -> TrainStep:
    """``state`` placed on ``device`` (an InputError when it is not here): the model moved
    there, the pool reduced to its first batch moved there, the cursor rewound."""
    state.device = resolve_device(device)
    if state.device.type != "cpu":
        state.model.to(state.device)
    state.batches = [to_device(state.batches[0], state.device)]
    state.rewind()
    return state


def build_on_device(name: str, device: torch.device | str = "cpu", **knobs: Any) -> TrainStep:
    """Built-in workload ``name`` (``knobs`` as for ``build_workload``) ``on_device``."""
    return on_device(build_workload(name, **knobs), device)


def timed_steps(state: TrainStep, n: int, around_forward: AroundForward | None = None) -> list[float]:
    """Wall milliseconds of ``n`` steps of ``state`` (its device synchronised around each),
    forward + loss of each inside a fresh ``around_forward()`` when given."""
    times = []
    for _ in range(n):
        synchronize(state.device)
        t0 = time.perf_counter()
        state.run(around_forward=around_forward() if around_forward is not None else None)
        synchronize(state.device)
        times.append((time.perf_counter() - t0) * 1000.0)
    return times


__all__ = ["AroundForward", "build_on_device", "on_device", "resolve_device", "synchronize",
           "timed_steps", "to_device"]

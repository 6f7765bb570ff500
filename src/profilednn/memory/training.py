"""A built-in workload's training step (the shared ``TrainStep``) on a chosen device, with
room for a context (offloading, counters) around forward and loss.

The memory job measures the same step as every other job; the only additions are the
device (the model is moved before its first step, so the optimizer's state is created
where the weights live) and the optional ``around_forward`` context.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, ContextManager

import torch

from ..errors import InputError
from ..train_step import TrainStep, to_device
from ..workloads import Workload, build_workload


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


class DeviceStep:
    """One workload's training step on ``device``."""

    def __init__(self, workload: Workload, device: torch.device | str = "cpu") -> None:
        self.workload = workload
        self.device = resolve_device(device)
        if self.device.type != "cpu":
            workload.model.to(self.device)
        self._batch: tuple[Any, Any] | None = None

    @classmethod
    def build(cls, name: str, device: torch.device | str = "cpu", **knobs: Any) -> "DeviceStep":
        return cls(build_workload(name, **knobs), device)

    @property
    def model(self) -> torch.nn.Module:
        return self.workload.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.workload.optimizer

    def batch(self) -> tuple[Any, Any]:
        """The first batch of the workload's pool, on the device (the same one every step,
        so memory comparisons see identical data)."""
        if self._batch is None:
            self._batch = to_device(self.workload.batches[0], self.device)
        return self._batch

    def as_train_step(self) -> TrainStep:
        """The workload's ``TrainStep`` on this device."""
        return self.workload.as_train_step(self.device)

    def step(self, around_forward: Callable[[], ContextManager[Any]] | None = None) -> float:
        """One ``TrainStep`` on the device batch, forward + loss inside ``around_forward()``."""
        context = around_forward() if around_forward is not None else None
        return self.as_train_step().run(self.batch(), around_forward=context).loss

    def timed_steps(self, n: int, around_forward: Callable[[], ContextManager[Any]] | None = None) -> list[float]:
        """Wall milliseconds of ``n`` steps (device synchronised around each)."""
        times = []
        for _ in range(n):
            synchronize(self.device)
            t0 = time.perf_counter()
            self.step(around_forward)
            synchronize(self.device)
            times.append((time.perf_counter() - t0) * 1000.0)
        return times


__all__ = ["DeviceStep", "resolve_device", "synchronize", "to_device"]

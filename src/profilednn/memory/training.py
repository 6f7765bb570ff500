"""A built-in workload's plain training step on a chosen device, with room for a context
(offloading, counters) around forward and loss.

The memory job measures steps of the same shape as ``Workload.train_step``; the only
additions are the device (the model is moved before its first step, so the optimizer's
state is created where the weights live) and the optional ``around_forward`` context.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, ContextManager

import torch

from ..errors import InputError
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


def to_device(value: Any, device: torch.device) -> Any:
    """Tensors in ``value`` (nested lists/tuples/dicts) moved to ``device``."""
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_device(v, device) for v in value)
    return value


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

    def forward_loss(self, around_forward: ContextManager[Any] | None = None) -> torch.Tensor:
        inputs, targets = self.batch()
        with around_forward if around_forward is not None else contextlib.nullcontext():
            outputs = self.workload.forward(inputs)
            loss = self.workload.loss_fn(outputs, targets)
        return loss

    def step(self, around_forward: Callable[[], ContextManager[Any]] | None = None) -> float:
        """zero_grad, forward + loss (inside ``around_forward()``), backward, optimizer step."""
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.forward_loss(around_forward() if around_forward is not None else None)
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())

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

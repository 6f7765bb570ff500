"""Model FLOPs of one training step, by compute dtype, and the GEMM peaks to weigh them:
the one home of ``optimize``'s FLOP counts and peak lookups.

``torch.utils.flop_counter`` counts matmul and convolution FLOPs but not their dtype; a
setup under BF16 autocast runs them in BF16 and must be held against the BF16 peak
(``hardware.dtypes``: mfu = sum_d FLOPs_d / peak_d over the step time). The counter
below applies the same FLOP formulas (``flop_registry``) and files each op under the
dtype of its first tensor argument, as the kernel that ran it sees it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from ..errors import ProfileDNNError
from ..hardware.probe import ProbeFn
from ..topology import CpuTopology, dtype_speed
from ..train_step import TrainStep
from ..vocabulary import TORCH_DTYPE
from .recipe_contract import Context, Recipe
from .trial import build

TORCH_DTYPE_NAMES = {getattr(torch, attr): name for name, attr in {**TORCH_DTYPE, "fp64": "float64"}.items()}


class DtypeFlopCounter(TorchDispatchMode):
    """Counts ``flop_registry`` FLOPs (matmuls, convolutions, attention) per dtype."""

    def __init__(self) -> None:
        super().__init__()
        self.flops: dict[str, float] = defaultdict(float)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            name = TORCH_DTYPE_NAMES.get(first.dtype, str(first.dtype)) if first is not None else "fp32"
            self.flops[name] += float(formula(*args, **kwargs, out_val=out))
        return out


def _one_step(setup: TrainStep, counter: Any) -> None:
    """One forward + backward of a clone of ``setup`` under ``counter`` (a dispatch mode)."""
    probe = setup.clone()
    inputs, targets = probe.next_batch()
    with counter:
        loss = probe.loss_fn(probe.forward(inputs), targets)
        loss.backward()


def step_flops(setup: TrainStep) -> float:
    """Model FLOPs of one training step (forward + backward) of a clone of ``setup``,
    counted by ``torch.utils.flop_counter.FlopCounterMode`` (matmuls and convolutions)."""
    counter = FlopCounterMode(display=False)
    _one_step(setup, counter)
    return float(counter.get_total_flops())


def step_flops_by_dtype(setup: TrainStep) -> dict[str, float]:
    """Model FLOPs of one forward + backward of a clone of ``setup``, by compute dtype
    (its autocast policy included: a BF16 setup's convolutions count as ``bf16``)."""
    counter = DtypeFlopCounter()
    _one_step(setup, counter)
    return {d: f for d, f in sorted(counter.flops.items()) if f > 0}


def machine_peaks(threads: int, probe: ProbeFn | None = None) -> tuple[dict[str, float], str | None]:
    """This machine's measured GEMM peak (GFLOP/s) at ``threads`` per native dtype, checked by a
    probe first (``hardware/drift.py``: scaled when the machine drifted), and a note: why there
    is no peak, or that the peaks were scaled (None when the cache held)."""
    try:
        from ..hardware.dtypes import peaks_by_dtype
        from ..hardware.drift import SCALED, checked_machine
    except ImportError as exc:
        return {}, f"no machine GEMM peak: {exc}"
    try:
        check = checked_machine(threads, probe=probe)
        return peaks_by_dtype(check.machine, threads), check.note if check.verdict == SCALED else None
    except ProfileDNNError as exc:
        return {}, f"no machine GEMM peak: {exc}"


def precision_peaks(chosen: list[Recipe], topo: CpuTopology) -> dict[str, float] | None:
    """This machine's GEMM peaks, fetched (measured once, then cached) only where a chosen
    recipe's dtype needs them to say whether it pays: a vector ISA for it, no matrix unit."""
    if not any(dtype_speed(r.precision, topo.isa).basis == "unmeasured" for r in chosen if r.precision):
        return None
    peaks, _ = machine_peaks(torch.get_num_threads())
    return peaks or None


@dataclass
class FlopCount:
    """Model FLOPs per step by dtype, stock and optimized, and the GEMM peaks to weigh them."""

    by_dtype: dict[str, float] | None = None
    by_dtype_final: dict[str, float] | None = None
    peaks: dict[str, float] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> float | None:
        return None if self.by_dtype is None else sum(self.by_dtype.values())


def count_flops(base: TrainStep, accepted: list[Recipe], ctx: Context, say: Callable[[str], None]) -> FlopCount:
    """The stock and the optimized step's model FLOPs by dtype, and this machine's peaks."""
    say("model FLOPs of one step, by compute dtype")
    by_dtype = step_flops_by_dtype(base)
    # a compiler changes no FLOPs, and a compiled setup cannot be cloned to count them
    uncompiled = [r for r in accepted if r.family != "compiler"]
    by_dtype_final = step_flops_by_dtype(build(base, uncompiled, ctx)) if accepted else dict(by_dtype)
    say("machine GEMM peaks (measured once, then cached)")
    peaks, why = machine_peaks(torch.get_num_threads())
    if why and peaks:
        say(why)
    return FlopCount(by_dtype, by_dtype_final, peaks, [why] if why else [])


__all__ = ["DtypeFlopCounter", "FlopCount", "count_flops", "machine_peaks", "precision_peaks", "step_flops",
           "step_flops_by_dtype"]

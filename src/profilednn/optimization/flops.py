"""Model FLOPs of one training step, by compute dtype, and the GEMM peaks to weigh them.

``torch.utils.flop_counter`` counts matmul and convolution FLOPs but not their dtype; a
setup under BF16 autocast runs them in BF16 and must be held against the BF16 peak
(``projection.dtypes``: mfu = sum_d FLOPs_d / peak_d over the step time). The counter
below applies the same FLOP formulas (``flop_registry``) and files each op under the
dtype of its first tensor argument, as the kernel that ran it sees it.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from ..errors import ProfileDNNError
from ..train_step import TrainStep

TORCH_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
                     torch.float64: "fp64"}


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


def step_flops_by_dtype(setup: TrainStep) -> dict[str, float]:
    """Model FLOPs of one forward + backward of a clone of ``setup``, by compute dtype
    (its autocast policy included: a BF16 setup's convolutions count as ``bf16``)."""
    probe = setup.clone()
    inputs, targets = probe.next_batch()
    with DtypeFlopCounter() as counter:
        loss = probe.loss_fn(probe.forward(inputs), targets)
        loss.backward()
    return {d: f for d, f in sorted(counter.flops.items()) if f > 0}


def machine_peaks(threads: int) -> tuple[dict[str, float], str | None]:
    """This machine's measured GEMM peak (GFLOP/s) at ``threads`` per native dtype, or why not."""
    try:
        from ..projection.dtypes import peaks_by_dtype
        from ..projection.machine import get_machine
    except ImportError as exc:
        return {}, f"no machine GEMM peak: {exc}"
    try:
        return peaks_by_dtype(get_machine(), threads), None
    except ProfileDNNError as exc:
        return {}, f"no machine GEMM peak: {exc}"


__all__ = ["DtypeFlopCounter", "machine_peaks", "step_flops_by_dtype"]

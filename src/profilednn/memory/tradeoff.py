"""Memory vs step time for none / offload / checkpoint / both, on one workload and device.

Each configuration builds the workload afresh (same seed: same weights and data), runs
warm-up steps, then one observed step (saved activations left on the device, peak) and
``steps`` timed steps without observation (median and spread of the step time).

``saved_device_bytes`` is what autograd keeps on the compute device at the end of the
forward: every saved tensor for none/checkpoint (a checkpointed segment keeps only its
inputs), the tensors under the size threshold for offload/both. ``peak_bytes`` is the
step's measured peak on that device (``peak.measure_step_peak``). On a CPU the host *is*
the device, so offloading moves bytes without lowering the peak; the table shows it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import polars as pl

from ..errors import InputError
from ..tables import MEMORY_TRADEOFF
from .activations import SavedTensorCounter
from .checkpointing import apply_checkpointing, parse_policy
from .offload import DEFAULT_MIN_BYTES, offload_activations
from .peak import measure_step_peak
from .training import build_on_device, timed_steps

CONFIGS = ("none", "offload", "checkpoint", "both")
TRADEOFF_SCHEMA = MEMORY_TRADEOFF.schema  # the catalogue's (profilednn.tables)


def memory_tradeoff(
    name: str,
    *,
    device: str = "cpu",
    configs: tuple[str, ...] = CONFIGS,
    checkpoint_policy: str = "every:2",
    offload_min_bytes: int = DEFAULT_MIN_BYTES,
    offload_max_bytes: int | None = None,
    prefetch: int = 2,
    warmup: int = 1,
    steps: int = 3,
    progress: Callable[[str], None] | None = None,
    **knobs: Any,
) -> pl.DataFrame:
    """One row per configuration (``TRADEOFF_SCHEMA``); ratios are against ``none``."""
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        raise InputError(f"unknown configuration(s) {', '.join(unknown)}; choose from {', '.join(CONFIGS)}")
    parse_policy(checkpoint_policy)
    rows: list[dict[str, Any]] = []
    for config in configs:
        if progress is not None:
            progress(config)
        state = build_on_device(name, device=device, **knobs)
        checkpointed = config in ("checkpoint", "both")
        if checkpointed:
            apply_checkpointing(state.model, checkpoint_policy)
        offloaded = config in ("offload", "both")

        def context(model: Any = state.model) -> Any:
            if offloaded:
                return offload_activations(min_bytes=offload_min_bytes, prefetch=prefetch, model=model,
                                           max_bytes=offload_max_bytes)
            return SavedTensorCounter(model)

        for _ in range(max(1, warmup)):
            state.run(around_forward=context() if offloaded else None)
        observed: list[Any] = []

        def observed_context() -> Any:
            ctx = context()
            observed.append(ctx)
            return ctx

        losses: list[float] = []
        state.optimizer.zero_grad(set_to_none=True)
        inputs, targets = state.batches[0]
        peak = measure_step_peak(lambda: losses.append(state.run(around_forward=observed_context()).loss),
                                 state.model, live=(state.model, state.optimizer, (inputs, targets)), device=state.device)
        ctx = observed[0]
        saved = ctx.stats.kept_bytes if offloaded else ctx.total
        offloaded_bytes = ctx.stats.offloaded_bytes if offloaded else 0
        times = timed_steps(state, max(1, steps), context if offloaded else None)
        rows.append({
            "config": config, "checkpoint_policy": checkpoint_policy if checkpointed else "none",
            "device": str(state.device), "batch_size": state.items_per_batch,
            "saved_device_bytes": saved, "offloaded_bytes": offloaded_bytes, "peak_bytes": peak.peak_bytes,
            "peak_vs_none": None, "step_ms": statistics.median(times), "step_ms_min": min(times),
            "step_ms_max": max(times), "slowdown_vs_none": None, "loss": losses[0],
        })
    df = pl.DataFrame(rows, schema=TRADEOFF_SCHEMA)
    base = df.filter(pl.col("config") == "none")
    if base.height:
        peak0, ms0 = float(base["peak_bytes"][0]), float(base["step_ms"][0])
        df = df.with_columns((pl.col("peak_bytes") / peak0).alias("peak_vs_none"),
                             (pl.col("step_ms") / ms0).alias("slowdown_vs_none"))
    return df


__all__ = ["CONFIGS", "TRADEOFF_SCHEMA", "memory_tradeoff"]

"""How much cache a cold replay evicts: the cache the Run could actually have used.

A replayed op is timed *cold* (``worker.CacheEvictor`` writes a buffer before each call):
inside a training step, the data an op reads was written by earlier ops and has been
pushed out of the caches by what ran in between. The buffer must match the cache the
Run's cores really reach, not what sysfs reports: a 2-core guest of an Intel Xeon reported
the host's whole 480 MiB L3, and evicting twice that made every replayed op run from
memory, where the step found much of its data in cache (own step predicted +39%).

- **measured** (the machine profile's working-set sweep, ``machine.measure_cache``): the
  largest working set that keeps 90% of the shared cache's bandwidth (69 MiB on that
  guest). Evicting that much leaves an op what a step leaves it; predicted own step +0.2%.
- **sysfs, per-core share**: without a measurement, the reported last-level cache, at most
  ``PER_CORE_CAP`` per thread of the Run (a guest may see its host's cache).

Either way, no more than the step's own **footprint** (the bytes its forward's compute ops
read, ``step_footprint_bytes``): a step whose data fits in the cache finds it there in
situ, and an op's inputs are at most one step old. small_cnn (30 MiB a step) replayed after
evicting the whole 69 MiB ran its native kernels from memory, +23% over their in-situ time.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import polars as pl

from ..hardware.machine import MachineProfile
from ..topology import CpuTopology
from ..vocabulary import CONV_FORWARD_OP, PROFILER_TYPE_BYTES, op_family
from .cases import parse_shapes

PER_CORE_CAP = 32 << 20  # no CPU the project has met gave a core more (the Xeon guest: ~35 MiB)
DEFAULT_CACHE = 32 << 20  # sysfs reports no cache at all


@dataclass(frozen=True)
class ReplayCache:
    """The bytes a cold replay evicts before each call, and why that many."""

    bytes: int
    source: str  # "measured" | "sysfs" | "sysfs, capped per core" | "default" [", bounded by the step's footprint"]
    detail: str

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


def step_footprint_bytes(ops: pl.DataFrame, steps: int) -> float | None:
    """Bytes per step the forward's compute ops read (their first input: the activations a
    training step passes through and keeps for its backward); None when the Run has no op
    table or no forward ops with shapes."""
    if ops.is_empty() or not {"op", "phase", "input_shapes", "dtypes", "calls"} <= set(ops.columns):
        return None
    total = 0.0
    fwd = ops.filter(pl.col("phase") == "forward").group_by("op", "input_shapes", "dtypes").agg(pl.col("calls").sum())
    for op, shapes_text, dtypes_text, calls in fwd.iter_rows():
        if op != CONV_FORWARD_OP and op_family(op) is None:
            continue
        shapes, dtypes = parse_shapes(shapes_text), parse_shapes(dtypes_text)
        if shapes and isinstance(shapes[0], list) and shapes[0] and dtypes:
            total += math.prod(shapes[0]) * PROFILER_TYPE_BYTES.get(dtypes[0], 4) * calls
    return total / max(steps, 1) or None


def replay_cache(machine: MachineProfile | None, topo: CpuTopology, threads: int,
                 footprint: float | None = None) -> ReplayCache:
    """The cache the Run's ``threads`` could have used here, at most the step's
    ``footprint`` in bytes (see the module doc)."""
    cache = _cache(machine, topo, threads)
    if footprint is not None and 0 < footprint < cache.bytes:
        return ReplayCache(int(footprint), cache.source + ", bounded by the step's footprint",
                           f"the step's forward reads {_mib(int(footprint))} a step, less than the cache: in situ "
                           f"its data is still cached; {cache.detail}")
    return cache


def _cache(machine: MachineProfile | None, topo: CpuTopology, threads: int) -> ReplayCache:
    reported = topo.llc_bytes
    said = f"sysfs reports a {_mib(reported)} last-level cache" if reported else "sysfs reports no cache"
    if machine is not None and machine.cache_bytes and machine.source == "measured":
        return ReplayCache(int(machine.cache_bytes), "measured",
                           f"the cache this machine's {machine.cores} core(s) reach, measured: the working set at which "
                           f"bandwidth falls halfway from the cache's to memory's is {_mib(machine.cache_bytes)} ({said})")
    if not reported:
        return ReplayCache(DEFAULT_CACHE, "default", f"{said}: {_mib(DEFAULT_CACHE)} assumed")
    cap = max(1, threads) * PER_CORE_CAP
    if reported > cap:
        return ReplayCache(cap, "sysfs, capped per core",
                           f"{said}, more than {threads} thread(s) could use: {_mib(PER_CORE_CAP)} per thread "
                           "(not measured: `profilednn machine --refresh` measures it)")
    return ReplayCache(reported, "sysfs", f"{said} (not measured: `profilednn machine --refresh` measures it)")


__all__ = ["DEFAULT_CACHE", "PER_CORE_CAP", "ReplayCache", "replay_cache", "step_footprint_bytes"]

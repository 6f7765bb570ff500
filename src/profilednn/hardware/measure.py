"""Measuring this machine: GEMM peaks, memory bandwidth, the cache sweep, first touch.

Projection needs two ceilings per machine: how many FLOP/s a well-shaped GEMM reaches
(per dtype the CPU runs natively, per thread count) and how many bytes/s the memory
system streams. Both are measured here with torch (MKL/oneDNN GEMM, a STREAM-triad
kernel), with the cache the cores reach and what a first touch of freshly mapped memory
costs (the allocator advice's page faults), under the kernel-choosing environment
(:data:`KERNEL_ENV`) recorded with them. ``measure_machine`` returns the whole
``MachineProfile``; ``machine.py`` caches it.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import statistics
import time
from collections.abc import Mapping
from typing import Callable

from ..topology import cpu_topology
from ..vocabulary import TORCH_DTYPE
from .machine_profile import MachineProfile, Measurement, normalize_dtype

# Environment variables that choose which GEMM/conv kernels run, so the peaks measured under
# them: oneDNN's ISA cap and default fp32 math mode, MKL's instruction cap, ATen's vector ISA.
KERNEL_ENV = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ONEDNN_DEFAULT_FPMATH_MODE",
              "DNNL_DEFAULT_FPMATH_MODE", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY")


def kernel_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The :data:`KERNEL_ENV` variables set in ``env`` (this process's by default)."""
    env = os.environ if env is None else env
    return {k: env[k].strip() for k in KERNEL_ENV if env.get(k, "").strip()}


def background_load_pct(interval_s: float = 0.5) -> float:
    """CPU use (percent of all CPUs) by everything else while this process sleeps."""
    import psutil

    return float(psutil.cpu_percent(interval=interval_s))


def _time_median(fn: Callable[[], object], repeats: int, inner: int) -> list[float]:
    """Per-call seconds of ``fn``: ``repeats`` samples, each the mean of ``inner`` calls."""
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - t0) / inner)
    return samples


def measure_gemm(dtype: str, threads: int, n: int = 1024, repeats: int = 7,
                 budget_s: float = 0.6) -> Measurement:
    """GFLOP/s of an ``n x n x n`` matmul at ``threads`` threads, after warm-up."""
    import torch

    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        tdt = getattr(torch, TORCH_DTYPE[normalize_dtype(dtype)])
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(n, n, generator=gen).to(tdt)
        b = torch.randn(n, n, generator=gen).to(tdt)
        out = torch.empty(n, n, dtype=tdt)
        t0 = time.perf_counter()
        for _ in range(2):
            torch.matmul(a, b, out=out)
        one = max((time.perf_counter() - t0) / 2, 1e-6)
        inner = max(1, min(20, int(budget_s / repeats / one)))
        secs = _time_median(lambda: torch.matmul(a, b, out=out), repeats, inner)
    finally:
        torch.set_num_threads(prev)
    return Measurement.of([2.0 * n ** 3 / s / 1e9 for s in secs])


def measure_bandwidth(threads: int, mbytes: int = 256, repeats: int = 7) -> Measurement:
    """STREAM-triad-like bandwidth (``a = b + s*c``) in GB/s, counting 3 arrays moved."""
    import torch

    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        n = mbytes * 2 ** 20 // 12  # three fp32 arrays of n elements
        b = torch.ones(n)
        c = torch.full((n,), 2.0)
        a = torch.empty(n)
        for _ in range(2):
            torch.add(b, c, alpha=3.0, out=a)
        secs = _time_median(lambda: torch.add(b, c, alpha=3.0, out=a), repeats, 1)
    finally:
        torch.set_num_threads(prev)
    return Measurement.of([3 * 4 * n / s / 1e9 for s in secs])


# The cache's capacity: where the bandwidth of a working set has fallen halfway from the
# shared cache's plateau to memory's floor.
def cache_sweep(threads: int, largest_bytes: int, smallest_bytes: int = 1 << 20,
                budget_s: float = 0.08) -> list[tuple[float, float]]:
    """(MiB, GB/s) of an in-place pass (``a += 1``: one read, one write per element) over
    working sets from ``smallest_bytes`` to ``largest_bytes`` (x1.25 steps), best of repeats."""
    import torch

    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    out = []
    try:
        size = smallest_bytes
        while size <= largest_bytes:
            a = torch.ones(size // 4)
            for _ in range(2):
                a.add_(1.0)
            t0 = time.perf_counter()
            a.add_(1.0)
            one = max(time.perf_counter() - t0, 1e-6)
            inner = max(1, min(200, int(budget_s / 3 / one)))
            best = min(_time_median(lambda: a.add_(1.0), 3, inner))
            out.append((size / 2**20, 2 * size / best / 1e9))
            size = int(size * 1.25) // 4096 * 4096
            del a
    finally:
        torch.set_num_threads(prev)
    return out


def cache_knee(sweep: list[tuple[float, float]], private_bytes: int = 4 << 20) -> int | None:
    """The capacity of the cache the cores reach (bytes): the working set at which the
    bandwidth has fallen halfway from the shared cache's plateau (its best once the private
    caches are outgrown: sizes >= 2 x ``private_bytes``, the cores' L2s together) to memory's
    floor (the largest sizes), interpolated in log size. None when it never falls that far
    (the cache is larger than the sweep, or there is no cache to see)."""
    tail = [(m, g) for m, g in sweep if m * 2**20 >= 2 * private_bytes] or sweep
    if len(tail) < 3:
        return None
    plateau = max(g for _, g in tail)
    floor = min(g for _, g in tail[-3:])
    if floor > 0.75 * plateau:
        return None
    mid = (plateau + floor) / 2
    start = next(i for i, (_, g) in enumerate(tail) if g == plateau)
    for (m0, g0), (m1, g1) in zip(tail[start:], tail[start + 1:]):
        if g1 < mid <= g0:
            t = (g0 - mid) / (g0 - g1)
            return int(m0 * (m1 / m0) ** t * 2**20)
    return None


def measure_cache(threads: int, reported_llc: int | None, private_l2: int | None = None
                  ) -> tuple[int | None, list[tuple[float, float]]]:
    """The cache this process's ``threads`` cores reach (bytes, None if the sweep never left
    it) and the sweep: up to 2 x the reported last-level cache, at least 256 MiB, at most
    1 GiB. A guest's sysfs may report the host's whole cache (a 2-core slice of a Xeon
    showed 480 MiB, and its bandwidth fell past ~64 MiB)."""
    largest = int(min(max(2 * (reported_llc or 0), 256 << 20), 1 << 30))
    sweep = cache_sweep(threads, largest)
    return cache_knee(sweep, threads * (private_l2 or 1 << 20)), sweep


# glibc's malloc serves a request above its mmap threshold (at most 32 MiB on 64-bit) with a
# fresh mapping and unmaps it on free: 64 MiB is above it whatever the threshold has grown to.
FIRST_TOUCH_MIB = 64


def measure_first_touch(threads: int, mbytes: int = FIRST_TOUCH_MIB, repeats: int = 7,
                        blocks: int = 3) -> float:
    """What the first touch of freshly mapped memory costs, ms per MiB, at ``threads``
    threads: filling a newly mapped ``mbytes`` region (a private anonymous ``mmap``, as glibc
    maps a large buffer, filled through a tensor view and unmapped after each repeat) minus
    filling one reused buffer of the same size: the median of ``repeats`` interleaved pairs
    after warm-up, the lowest of ``blocks`` such medians (a busy neighbour only adds time;
    one block on the 2-core KVM guest ranged 0.2-0.4 ms/MiB), at least 0. That difference
    is the page faults, the kernel zeroing each page and the unmapping, which a step pays for
    every page the default allocator hands back and faults in again. Mapping directly, not
    through ``malloc``, keeps the figure honest in a long-lived process (a job that ran
    steps may hold a free heap hole that size, reused without a fault) and under a
    preloaded caching allocator; the kernel's transparent-huge-page mode still applies."""
    import mmap

    import torch

    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        n = max(1, mbytes * 2**20 // 4)
        reused = torch.empty(n)

        def fresh() -> None:
            region = mmap.mmap(-1, n * 4, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            view = torch.frombuffer(region, dtype=torch.float32)
            view.fill_(1.0)
            del view  # releases the buffer, so the region can be unmapped
            region.close()

        for _ in range(2):
            fresh()
            reused.fill_(1.0)
        medians = []
        for _ in range(max(1, blocks)):
            diffs = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                fresh()
                t1 = time.perf_counter()
                reused.fill_(1.0)
                diffs.append((t1 - t0) - (time.perf_counter() - t1))
            medians.append(statistics.median(diffs))
        del reused
    finally:
        torch.set_num_threads(prev)
    return max(0.0, min(medians) * 1e3 / (n * 4 / 2**20))


def _thread_counts(cores: int) -> list[int]:
    """1, each power of two below ``cores``, and ``cores``."""
    counts, t = {1, cores}, 2
    while t < cores:
        counts.add(t)
        t *= 2
    return sorted(counts)


def _gemm_size(cores: int) -> int:
    """A square size that keeps every core busy for tens of milliseconds per call: at
    1024^3 a 2-core AMD EPYC reached 115-142 GFLOP/s against 162 at 2048^3 (thread
    start-up and packing weigh on the small call), so the peak, and every MFU against it,
    was off by up to 30%."""
    return int(min(4096, 2048 * max(1.0, (cores / 2) ** (1 / 3))) // 64 * 64)


def onednn_version() -> str | None:
    """oneDNN's version as bundled in this torch build (parsed from its build config)."""
    try:
        import torch

        m = re.search(r"MKL-DNN v([\d.]+)", torch.__config__.show())
        return m.group(1) if m else None
    except Exception as exc:  # torch missing or config unreadable: say so in the value
        return f"unknown ({type(exc).__name__})"


def measure_machine(progress: Callable[[str], None] | None = None) -> MachineProfile:
    """Measure this machine now (a few seconds per thread count and dtype)."""
    import torch

    topo = cpu_topology()
    cores = topo.physical_cores
    n = _gemm_size(cores)
    if progress:
        progress("checking that the CPUs are idle")
    background = background_load_pct()
    gemm: dict[str, dict[int, Measurement]] = {}
    for dt in topo.native_dtypes:
        for t in _thread_counts(cores):
            if progress:
                progress(f"GEMM {dt} {n}x{n}x{n}, {t} thread(s)")
            gemm.setdefault(dt, {})[t] = measure_gemm(dt, t, n=n)
    bandwidth: dict[int, Measurement] = {}
    for t in sorted({1, cores}):
        if progress:
            progress(f"memory bandwidth (triad), {t} thread(s)")
        bandwidth[t] = measure_bandwidth(t)
    if progress:
        progress(f"the cache {cores} core(s) reach (working-set sweep)")
    cache_bytes, sweep = measure_cache(cores, topo.llc_bytes, topo.cache_bytes(2))
    if progress:
        progress(f"first touch of fresh {FIRST_TOUCH_MIB} MiB buffers (page faults), {cores} thread(s)")
    page_fault = measure_first_touch(cores)
    if progress:
        progress("the probe's reference (a small GEMM per dtype and a triad, each thread count)")
    from .probe import reference_probes

    reference = reference_probes(_thread_counts(cores), [d for d in topo.native_dtypes if d in gemm])
    stamp = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return MachineProfile(
        name=f"{topo.model_name} ({cores} cores)",
        cpu_model=topo.model_name,
        cores=cores,
        sockets=topo.sockets,
        numa_nodes=topo.numa_nodes,
        logical_cpus=topo.logical_cpus,
        isa=tuple(sorted(topo.isa)),
        native_dtypes=topo.native_dtypes,
        gemm=gemm,
        bandwidth=bandwidth,
        torch=torch.__version__,
        onednn=onednn_version(),
        measured=stamp,
        source="measured",
        gemm_size=n,
        measured_at={k: stamp for k in ("gemm", "bandwidth", "cache", "first_touch", "probe")},
        probe_reference=reference.to_dict(),
        topology=topo,
        background_load_pct=background,
        cache_bytes=cache_bytes,
        cache_sweep=sweep,
        page_fault_ms_per_mib=page_fault,
        kernel_env=kernel_env(),
    )


__all__ = ["FIRST_TOUCH_MIB", "KERNEL_ENV", "background_load_pct", "cache_knee", "cache_sweep", "kernel_env",
           "measure_bandwidth", "measure_cache", "measure_first_touch", "measure_gemm", "measure_machine",
           "onednn_version"]

"""The machine's profile: topology, ISA, measured GEMM peaks and memory bandwidth.

Projection needs two ceilings per machine: how many FLOP/s a well-shaped GEMM reaches
(per dtype the CPU runs natively, per thread count) and how many bytes/s the memory
system streams. Both are measured here with torch (MKL/oneDNN GEMM, a STREAM-triad
kernel), once per machine and torch version, and cached as a small TOML file, with the
cache the cores reach and what a first touch of freshly mapped memory costs (the
allocator advice's page faults). The same file format, written by hand with a few keys,
describes another machine for what-ifs.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import math
import os
import re
import statistics
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Mapping
from typing import Any, Callable

import tomli_w

from ..cache import cache_dir
from ..errors import InputError
from ..atomic import atomic_write_text
from ..topology import CpuTopology, DtypeSpeed, cpu_topology, dtype_speed, faster_dtypes
from ..vocabulary import DTYPE_NAMES, TORCH_DTYPE, dtype_name

MACHINE_FORMAT = 1


def normalize_dtype(dtype: str) -> str:
    """``f32``/``float32``/``fp32`` -> ``fp32`` (likewise bf16, fp16)."""
    name = dtype_name(dtype)
    if name is None:
        raise InputError(f"unknown dtype {dtype!r}; use one of fp32, bf16, fp16")
    return name


@dataclass(frozen=True)
class Measurement:
    """One measured throughput: median over repeats and its spread.

    ``best`` (the fastest sample) is what a ceiling uses: noise from other processes,
    interrupts or frequency changes only ever slows a kernel down.
    """

    median: float
    min: float
    max: float
    repeats: int

    @classmethod
    def of(cls, values: list[float]) -> "Measurement":
        return cls(statistics.median(values), min(values), max(values), len(values))

    @property
    def best(self) -> float:
        return self.max

    def to_dict(self) -> dict[str, Any]:
        return {"median": self.median, "min": self.min, "max": self.max, "repeats": self.repeats}


@dataclass
class MachineProfile:
    """A CPU's ceilings for projection: GEMM peak per (dtype, threads) and bandwidth.

    ``gemm[dtype][threads]`` holds measured GFLOP/s; a hand-written machine file may give
    only one figure per dtype for all cores (``threads == cores``), and other thread
    counts are then scaled linearly (stated in ``assumptions``).
    """

    name: str
    cpu_model: str
    cores: int
    sockets: int = 1
    numa_nodes: int = 1
    logical_cpus: int | None = None
    isa: tuple[str, ...] = ()
    native_dtypes: tuple[str, ...] = ("fp32",)
    gemm: dict[str, dict[int, Measurement]] = field(default_factory=dict)
    bandwidth: dict[int, Measurement] = field(default_factory=dict)
    torch: str | None = None
    onednn: str | None = None
    measured: str | None = None
    source: str = "measured"  # measured | file
    gemm_size: int | None = None
    topology: CpuTopology | dict[str, Any] | None = None
    background_load_pct: float | None = None  # CPU use by other processes while measuring
    # the cache this machine's cores reach, measured (bytes; see measure_cache), and the sweep
    cache_bytes: int | None = None
    cache_sweep: list[tuple[float, float]] = field(default_factory=list)  # (MiB, GB/s) at all cores
    # ms per MiB that filling a freshly mapped buffer costs over a reused one, at all cores
    # (page faults plus the kernel zeroing each page; see measure_first_touch)
    page_fault_ms_per_mib: float | None = None
    # the kernel-choosing environment it was measured under (KERNEL_ENV: ONEDNN_MAX_CPU_ISA, ...)
    kernel_env: dict[str, str] = field(default_factory=dict)
    # when each group of figures was measured (gemm, bandwidth, cache, first_touch, probe)
    measured_at: dict[str, str] = field(default_factory=dict)
    # the probes recorded with the peaks (probe.ProbeReference.to_dict): what drift.py checks against
    probe_reference: dict[str, Any] = field(default_factory=dict)

    # -- ceilings ------------------------------------------------------------------------
    def has_native(self, dtype: str) -> bool:
        """Whether the ISA computes ``dtype`` natively (a ceiling to hold it against);
        whether it is *faster* than fp32 is :meth:`dtype_speed`'s question."""
        return normalize_dtype(dtype) in self.native_dtypes

    @property
    def peaks(self) -> dict[str, float]:
        """Peak GEMM GFLOP/s with all cores, per dtype with a figure."""
        return {dt: self.gemm_peak_gflops(dt) for dt in self.gemm}

    def dtype_speed(self, dtype: str) -> DtypeSpeed:
        """Whether ``dtype`` pays here: a GEMM peak above fp32's, or (unmeasured) a matrix unit
        (see :func:`profilednn.topology.dtype_speed`)."""
        return dtype_speed(normalize_dtype(dtype), self.isa, self.peaks)

    def faster_dtypes(self) -> dict[str, str]:
        """``{dtype: reason}`` for each reduced-precision dtype that pays on this machine."""
        return faster_dtypes(self.isa, self.peaks)

    def gemm_peak_gflops(self, dtype: str = "fp32", threads: int | None = None) -> float:
        """Peak GEMM GFLOP/s (best of the repeats) for ``dtype`` at ``threads`` (None: all cores).

        A thread count that was not measured is scaled linearly from the nearest measured
        one below it (or above, when none is below); threads beyond the physical cores
        add nothing (hyperthreads share the FMA units).
        """
        dt = normalize_dtype(dtype)
        table = self.gemm.get(dt)
        if not table:
            native = ", ".join(self.native_dtypes)
            raise InputError(
                f"{self.name} has no {dt} GEMM peak (natively it runs: {native}); "
                f"{dt} is emulated there, so there is no native ceiling to project against"
            )
        t = self.cores if threads is None else max(1, min(int(threads), self.cores))
        if t in table:
            return table[t].best
        below = [k for k in table if k <= t]
        base = max(below) if below else min(table)
        return table[base].best * t / base

    @property
    def bandwidth_gbs(self) -> float:
        """Best STREAM-triad bandwidth with all cores, GB/s (1e9 bytes/s)."""
        return self.bandwidth_at(None)

    def bandwidth_at(self, threads: int | None = None) -> float:
        """Bandwidth at ``threads``: the measured figure at or below it (bandwidth
        saturates, so it is not scaled up; fewer threads scale down linearly)."""
        if not self.bandwidth:
            raise InputError(f"{self.name} has no memory bandwidth figure")
        t = self.cores if threads is None else max(1, min(int(threads), self.cores))
        if t in self.bandwidth:
            return self.bandwidth[t].best
        below = [k for k in self.bandwidth if k <= t]
        if below:
            return self.bandwidth[max(below)].best
        base = min(self.bandwidth)
        return self.bandwidth[base].best * t / base

    @property
    def assumptions(self) -> list[str]:
        out = []
        for dt, table in self.gemm.items():
            if set(table) != set(range(1, self.cores + 1)):
                out.append(f"{dt} GEMM peak at unmeasured thread counts scales linearly "
                           f"from the measured counts {sorted(table)}")
        if self.source == "file":
            out.append(f"{self.name}: figures come from a machine file, not measured here")
        if self.contended:
            out.append(f"other processes used {self.background_load_pct:.0f}% of the CPUs while "
                       "this machine was measured: its peaks are likely low; run "
                       "`profilednn machine --refresh` on an idle machine")
        return out

    @property
    def contended(self) -> bool:
        """True when other processes were busy enough during measuring to lower the peaks."""
        return (self.background_load_pct or 0.0) > CONTENDED_LOAD_PCT

    # -- (de)serialisation ---------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        topo = self.topology.to_dict() if isinstance(self.topology, CpuTopology) else self.topology
        return {
            "format": MACHINE_FORMAT,
            "name": self.name,
            "cpu_model": self.cpu_model,
            "cores": self.cores,
            "sockets": self.sockets,
            "numa_nodes": self.numa_nodes,
            "logical_cpus": self.logical_cpus or self.cores,
            "isa": list(self.isa),
            "native_dtypes": list(self.native_dtypes),
            "torch": self.torch or "",
            "onednn": self.onednn or "",
            "measured": self.measured or "",
            "source": self.source,
            "gemm_size": self.gemm_size or 0,
            **({"background_load_pct": round(self.background_load_pct, 1)}
               if self.background_load_pct is not None else {}),
            "peak_gflops": {dt: self.gemm_peak_gflops(dt) for dt in self.gemm},
            "bandwidth_gbs": self.bandwidth_gbs if self.bandwidth else 0.0,
            "gemm": [
                {"dtype": dt, "threads": t, **{f"{k}_gflops" if k != "repeats" else k: v
                                               for k, v in m.to_dict().items()}}
                for dt, table in self.gemm.items() for t, m in sorted(table.items())
            ],
            "bandwidth": [
                {"threads": t, **{f"{k}_gbs" if k != "repeats" else k: v
                                  for k, v in m.to_dict().items()}}
                for t, m in sorted(self.bandwidth.items())
            ],
            **({"cache_bytes": int(self.cache_bytes)} if self.cache_bytes else {}),
            **({"cache": [{"mib": m, "gbs": g} for m, g in self.cache_sweep]} if self.cache_sweep else {}),
            **({"page_fault_ms_per_mib": round(self.page_fault_ms_per_mib, 4)}
               if self.page_fault_ms_per_mib is not None else {}),
            **({"kernel_env": dict(self.kernel_env)} if self.kernel_env else {}),
            **({"measured_at": dict(self.measured_at)} if self.measured_at else {}),
            **({"probe_reference": dict(self.probe_reference)} if self.probe_reference else {}),
            **({"topology": {k: v for k, v in (topo or {}).items() if k != "cores"}} if topo else {}),
        }

    def to_toml(self) -> str:
        header = ("# ProfileDNN machine profile. A hand-written one for what-ifs needs only:\n"
                  "#   name, cores, bandwidth_gbs, and [peak_gflops] with one GFLOP/s figure\n"
                  "#   per dtype for all cores (or [peak_flops] in FLOP/s).\n")
        return header + tomli_w.dumps(self.to_dict())

    def save(self, path: Path | str) -> Path:
        path = Path(path)
        atomic_write_text(path, self.to_toml())
        return path

    @classmethod
    def from_toml(cls, path: Path | str) -> "MachineProfile":
        return load_machine_file(path)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, origin: str = "machine file") -> "MachineProfile":
        return _profile_from_dict(data, origin)


# --------------------------------------------------------------------------- loading
def _num(value: Any, what: str, origin: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value <= 0:
        raise InputError(f"{origin}: {what} must be a positive number, not {value!r}")
    return float(value)


def _non_negative(value: Any, what: str, origin: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0:
        raise InputError(f"{origin}: {what} must be a number >= 0, not {value!r}")
    return float(value)


def _profile_from_dict(data: dict[str, Any], origin: str) -> MachineProfile:
    if "cores" not in data:
        raise InputError(f"{origin}: missing 'cores' (physical cores of the machine)")
    cores = int(_num(data["cores"], "cores", origin))
    gemm: dict[str, dict[int, Measurement]] = {}
    for row in data.get("gemm") or []:
        dt = normalize_dtype(row.get("dtype", "fp32"))
        t = int(_num(row.get("threads"), "gemm.threads", origin))
        med = _num(row.get("median_gflops"), "gemm.median_gflops", origin)
        gemm.setdefault(dt, {})[t] = Measurement(
            med, float(row.get("min_gflops", med)), float(row.get("max_gflops", med)),
            int(row.get("repeats", 1)))
    peaks = dict(data.get("peak_gflops") or {})
    for dt, flops in (data.get("peak_flops") or {}).items():
        peaks.setdefault(dt, _num(flops, f"peak_flops.{dt}", origin) / 1e9)
    for dt, value in peaks.items():
        ndt = normalize_dtype(dt)
        if ndt not in gemm:
            gemm[ndt] = {cores: Measurement.of([_num(value, f"peak_gflops.{dt}", origin)])}
    if not gemm:
        raise InputError(f"{origin}: no GEMM peak; add a [peak_gflops] table "
                         "(e.g. fp32 = 3000.0) or [peak_flops] in FLOP/s")
    bandwidth: dict[int, Measurement] = {}
    for row in data.get("bandwidth") or []:
        t = int(_num(row.get("threads"), "bandwidth.threads", origin))
        med = _num(row.get("median_gbs"), "bandwidth.median_gbs", origin)
        bandwidth[t] = Measurement(med, float(row.get("min_gbs", med)),
                                   float(row.get("max_gbs", med)), int(row.get("repeats", 1)))
    if not bandwidth:
        if "bandwidth_gbs" not in data:
            raise InputError(f"{origin}: missing 'bandwidth_gbs' (memory bandwidth, GB/s)")
        bandwidth[cores] = Measurement.of([_num(data["bandwidth_gbs"], "bandwidth_gbs", origin)])
    native = data.get("native_dtypes")
    native_dtypes = tuple(normalize_dtype(d) for d in native) if native else tuple(
        dt for dt in DTYPE_NAMES if dt in gemm)
    return MachineProfile(
        measured_at={str(k): str(v) for k, v in (data.get("measured_at") or {}).items()},
        probe_reference=dict(data.get("probe_reference") or {}),
        name=str(data.get("name") or data.get("cpu_model") or origin),
        cpu_model=str(data.get("cpu_model") or data.get("name") or "unknown"),
        cores=cores,
        sockets=int(data.get("sockets", 1)),
        numa_nodes=int(data.get("numa_nodes", 1)),
        logical_cpus=int(data.get("logical_cpus", cores)),
        isa=tuple(data.get("isa") or ()),
        native_dtypes=native_dtypes,
        gemm=gemm,
        bandwidth=bandwidth,
        torch=data.get("torch") or None,
        onednn=data.get("onednn") or None,
        measured=data.get("measured") or None,
        source=str(data.get("source") or "file"),
        gemm_size=int(data.get("gemm_size") or 0) or None,
        topology=dict(data.get("topology") or {}) or None,
        background_load_pct=(float(data["background_load_pct"])
                             if isinstance(data.get("background_load_pct"), (int, float)) else None),
        cache_bytes=int(_num(data["cache_bytes"], "cache_bytes", origin)) if "cache_bytes" in data else None,
        cache_sweep=[(float(row["mib"]), float(row["gbs"])) for row in data.get("cache") or []
                     if isinstance(row, dict) and {"mib", "gbs"} <= set(row)],
        page_fault_ms_per_mib=(_non_negative(data["page_fault_ms_per_mib"], "page_fault_ms_per_mib", origin)
                               if "page_fault_ms_per_mib" in data else None),
        kernel_env={str(k): str(v) for k, v in (data.get("kernel_env") or {}).items()},
    )


def load_machine_file(path: Path | str) -> MachineProfile:
    """Read a machine TOML: one ``profilednn machine -o`` wrote, or a hand-written one."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"no such machine file: {p}")
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise InputError(f"cannot read machine file {p}: {exc}") from exc
    prof = _profile_from_dict(data, str(p))
    if prof.source != "measured":
        prof.source = "file"
    return prof


# --------------------------------------------------------------------------- measuring
CONTENDED_LOAD_PCT = 20.0


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


# --------------------------------------------------------------------------- the cache
# Environment variables that choose which GEMM/conv kernels run, so the peaks measured under
# them: oneDNN's ISA cap and default fp32 math mode, MKL's instruction cap, ATen's vector ISA.
KERNEL_ENV = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ONEDNN_DEFAULT_FPMATH_MODE",
              "DNNL_DEFAULT_FPMATH_MODE", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY")


def kernel_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The :data:`KERNEL_ENV` variables set in ``env`` (this process's by default)."""
    env = os.environ if env is None else env
    return {k: env[k].strip() for k in KERNEL_ENV if env.get(k, "").strip()}


def machine_key(topo: CpuTopology | None = None) -> str:
    """Cache key: CPU model, cores visible to this process, ISA, torch version and the
    kernel-choosing environment (a profile measured with AMX must not answer for a process
    that runs with ``ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16``)."""
    import torch

    topo = topo or cpu_topology()
    parts = [topo.model_name, str(topo.physical_cores), str(topo.logical_cpus),
             ",".join(sorted(topo.isa)), torch.__version__]
    text = "|".join(parts + [f"{k}={v}" for k, v in kernel_env().items()])
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def cached_machine_path() -> Path:
    return cache_dir() / f"machine-{machine_key()}.toml"


def cached_machine() -> MachineProfile | None:
    """This machine's cached profile, or None when none is cached: never measures (advice
    asks it, and must stay quick)."""
    path = cached_machine_path()
    try:
        return load_machine_file(path) if path.is_file() else None
    except InputError:
        return None


def get_machine(refresh: bool = False, progress: Callable[[str], None] | None = None
                ) -> MachineProfile:
    """This machine's profile: read from the cache, or measured once and cached."""
    path = cached_machine_path()
    if path.is_file() and not refresh:
        try:
            prof = load_machine_file(path)
        except InputError as exc:
            import warnings

            warnings.warn(f"ignoring the unreadable machine cache ({exc}); measuring again",
                          stacklevel=2)
            prof = None
        if prof is not None:
            prof.source = "measured"
            prof.topology = cpu_topology()
            if prof.gemm_size and prof.gemm_size < _gemm_size(prof.cores or 1):
                prof = None  # measured with a GEMM too small to reach the peak: measure again
            elif not prof.contended:
                if _fill_in_later_measurements(prof, progress):
                    _save_quietly(prof, path)
                return prof
            # measured under load last time: try again, keep whichever saw the higher peak
    else:
        prof = None
    cached = prof
    prof = measure_machine(progress)
    if prof.contended:
        import warnings

        warnings.warn(f"other processes used {prof.background_load_pct:.0f}% of the CPUs while "
                      "measuring: the peaks are likely low; run `profilednn machine --refresh` "
                      "on an idle machine", stacklevel=2)
        if cached is not None and cached.gemm_peak_gflops() >= prof.gemm_peak_gflops():
            return cached
    _save_quietly(prof, path)
    return prof


def _fill_in_later_measurements(prof: MachineProfile, progress: Callable[[str], None] | None) -> bool:
    """Measure what a profile cached before a measurement existed lacks (the cache the cores
    reach, the first-touch cost); True when it gained a figure."""
    gained = False
    if prof.cache_bytes is None and not prof.cache_sweep:
        if progress:
            progress("the cache the cores reach (working-set sweep)")
        topo = cpu_topology()
        prof.cache_bytes, prof.cache_sweep = measure_cache(prof.cores, topo.llc_bytes, topo.cache_bytes(2))
        prof.measured_at["cache"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        gained = True
    if prof.page_fault_ms_per_mib is None:
        if progress:
            progress(f"first touch of fresh {FIRST_TOUCH_MIB} MiB buffers (page faults), {prof.cores} thread(s)")
        prof.page_fault_ms_per_mib = measure_first_touch(prof.cores)
        prof.measured_at["first_touch"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        gained = True
    return gained


def _save_quietly(prof: MachineProfile, path: Path) -> None:
    try:
        prof.save(path)
    except OSError as exc:
        import warnings

        warnings.warn(f"could not cache the machine profile at {path}: {exc}", stacklevel=2)


__all__ = [
    "KERNEL_ENV", "kernel_env",
    "MachineProfile",
    "Measurement",
    "cache_dir",
    "cached_machine",
    "cached_machine_path",
    "get_machine",
    "load_machine_file",
    "cache_knee",
    "measure_bandwidth",
    "measure_cache",
    "measure_first_touch",
    "measure_gemm",
    "measure_machine",
    "normalize_dtype",
    "onednn_version",
]

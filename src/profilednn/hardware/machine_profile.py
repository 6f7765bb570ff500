"""The machine profile: a CPU's ceilings for projection, and its TOML file.

``MachineProfile`` holds the GEMM peak per dtype and thread count, the memory bandwidth,
the cache the cores reach and the first-touch cost, with the CPU they were measured on;
``to_toml``/``save`` write it and ``load_machine_file`` reads it back: a file
``profilednn machine -o`` wrote, or a hand-written one with a few keys that describes
another machine for what-ifs. Measuring is ``measure.py``'s job, the per-machine cache
``machine.py``'s.
"""

from __future__ import annotations

import math
import statistics
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from ..errors import InputError
from ..atomic import atomic_write_text
from ..topology import CpuTopology, DtypeSpeed, dtype_speed, faster_dtypes
from ..vocabulary import DTYPE_NAMES, dtype_name

MACHINE_FORMAT = 1

# CPU use by other processes (percent) above which a measurement counts as contended
CONTENDED_LOAD_PCT = 20.0


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


__all__ = ["CONTENDED_LOAD_PCT", "MACHINE_FORMAT", "MachineProfile", "Measurement", "load_machine_file",
           "normalize_dtype"]

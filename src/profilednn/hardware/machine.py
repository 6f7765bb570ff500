"""This machine's profile, measured once per machine and torch version and cached.

The profile itself (``MachineProfile``, its TOML file) is ``machine_profile.py``'s and
measuring it ``measure.py``'s; this module keys the cache (CPU, cores, ISA, torch, the
kernel-choosing environment), reads it (``cached_machine``, never measuring), and measures
what is missing (``get_machine``). The names of both other modules are re-exported here,
their public import path.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
from pathlib import Path
from typing import Callable

from ..cache import cache_dir
from ..errors import InputError
from ..topology import CpuTopology, cpu_topology
from .machine_profile import (CONTENDED_LOAD_PCT, MACHINE_FORMAT, MachineProfile, Measurement, load_machine_file,
                              normalize_dtype)
from .measure import (FIRST_TOUCH_MIB, KERNEL_ENV, _gemm_size, background_load_pct, cache_knee, cache_sweep,
                      kernel_env, measure_bandwidth, measure_cache, measure_first_touch, measure_gemm,
                      measure_machine, onednn_version)


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
    "CONTENDED_LOAD_PCT", "FIRST_TOUCH_MIB", "MACHINE_FORMAT", "background_load_pct", "machine_key",
    "KERNEL_ENV", "kernel_env",
    "MachineProfile",
    "Measurement",
    "cache_dir",
    "cached_machine",
    "cached_machine_path",
    "get_machine",
    "load_machine_file",
    "cache_knee",
    "cache_sweep",
    "measure_bandwidth",
    "measure_cache",
    "measure_first_touch",
    "measure_gemm",
    "measure_machine",
    "normalize_dtype",
    "onednn_version",
]

"""The CPUs of ``tests/cpus/`` as the suite injects them: one recorded CPU replaces the
*detected* one (ISA flags, cores, caches) and this machine's cached profile (GEMM peaks,
bandwidth) for a test, so a CPU-facing test runs as on each CPU the project has met.

In this process only: child processes, native builds, oneDNN and PyTorch still see the real
CPU. The switch replaces ``profilednn.topology.detected_topology`` as a module attribute, so
call it through the module (as ``cpu_topology()`` does); a name imported before the switch
stays the silicon's, which ``kernels.build`` relies on (imported here, first, for that).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import pytest

import profilednn.kernels.build  # noqa: F401  (binds the real detected_topology before any switch)
from profilednn.topology import CpuTopology, topology_from_cpu_profile

CPUS = Path(__file__).parent / "cpus"
REAL = "real"  # the id of the real CPU in parametrized test names
ENV_TEST_CPU = "PROFILEDNN_TEST_CPU"  # NAME: the whole suite as that profile; "real": no profiles


def profile_names() -> list[str]:
    """Every complete profile in ``tests/cpus`` (cpuinfo, lscpu and machine files)."""
    names = sorted(p.name.removesuffix(".machine.toml") for p in CPUS.glob("*.machine.toml"))
    return [n for n in names if (CPUS / f"{n}.cpuinfo.txt").is_file() and (CPUS / f"{n}.lscpu.txt").is_file()]


def suite_cpu() -> str | None:
    """The profile ``PROFILEDNN_TEST_CPU`` names for the whole suite, ``real``, or None."""
    name = os.environ.get(ENV_TEST_CPU, "").strip() or None
    if name not in (None, REAL, *profile_names()):
        raise pytest.UsageError(f"{ENV_TEST_CPU}={name}: no such CPU profile in {CPUS}; "
                                f"use one of {', '.join([REAL, *profile_names()])}")
    return name


@dataclass(frozen=True)
class CpuProfile:
    """One recorded CPU: its topology, every flag its cpuinfo lists, its machine file."""

    name: str
    topology: CpuTopology
    cpuinfo_flags: frozenset[str]
    machine_file: Path

    def machine(self):
        """A fresh MachineProfile from the machine file (MachineProfile is mutable)."""
        from profilednn.hardware.machine import load_machine_file

        return load_machine_file(self.machine_file)


@lru_cache(maxsize=None)
def load_profile(name: str) -> CpuProfile:
    topo = topology_from_cpu_profile(CPUS, name)
    text = (CPUS / f"{name}.cpuinfo.txt").read_text(encoding="utf-8")
    flags = next((line.partition(":")[2].split() for line in text.splitlines() if line.startswith("flags")), [])
    return CpuProfile(name, topo, frozenset(flags), CPUS / f"{name}.machine.toml")


def apply_profile(mp: pytest.MonkeyPatch, profile: CpuProfile, cache: Path) -> None:
    """Make ``profile`` the detected CPU and its machine file this machine's cached profile.

    ``cache`` holds the machine profile unless a test names its own
    ``PROFILEDNN_CACHE_DIR``; measuring (``--refresh``, a stale cache, a figure the file
    lacks) returns the file's figures instead of timing this machine.
    """
    from profilednn import topology
    from profilednn.capture import fingerprint
    from profilednn.hardware import machine

    mp.setattr(topology, "detected_topology", lambda: profile.topology)
    mp.setattr(fingerprint, "_cpuinfo", lambda: (profile.topology.model_name, set(profile.cpuinfo_flags)))
    mp.setattr(machine, "cache_dir", lambda: Path(os.environ.get("PROFILEDNN_CACHE_DIR") or cache))
    mp.setattr(machine, "measure_machine", lambda progress=None: _measured(profile))
    recorded = profile.machine()  # the cache sweep too: the profile's own figures, never this machine's
    mp.setattr(machine, "measure_cache", lambda *args, **kwargs: (recorded.cache_bytes, list(recorded.cache_sweep)))
    mp.setattr(machine, "measure_first_touch", lambda *args, **kwargs: recorded.page_fault_ms_per_mib)
    path = machine.cached_machine_path()
    if not path.is_file():
        _measured(profile).save(path)


def _measured(profile: CpuProfile):
    """The profile's machine as ``measure_machine`` returns one: its figures, with the ISA of
    the CPU the test sees now (``PROFILEDNN_TEST_CPU_FLAGS`` or an injection may edit it)."""
    from profilednn.topology import cpu_topology

    topo = cpu_topology()
    return replace(profile.machine(), source="measured", topology=topo, isa=tuple(sorted(topo.isa)),
                   native_dtypes=topo.native_dtypes)


__all__ = ["CPUS", "CpuProfile", "ENV_TEST_CPU", "REAL", "apply_profile", "load_profile", "profile_names",
           "suite_cpu"]

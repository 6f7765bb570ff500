"""A machine profile that stands in the cache, so that a test measures nothing.

Its GEMM peaks (fp32: 90 GFLOP/s on 1 thread, 180 on 2) and triad bandwidth are fixed, and
it records no probe: a job that reads the cached machine (``project``, ``optimize``'s MFU)
neither measures peaks nor probes for drift, so its figures are the same on every call and
every CPU (with the host's own cache, a drift beyond noise re-measures the peaks mid-test).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from profilednn.hardware.machine import MachineProfile, Measurement, cached_machine_path


def cached_box(page_fault_ms_per_mib: float | None = None) -> MachineProfile:
    """The stand-in profile (``page_fault_ms_per_mib``: the page-fault cost it states, if any)."""
    return MachineProfile(name="cached box", cpu_model="cached", cores=2,
                          gemm={"fp32": {1: Measurement.of([90.0]), 2: Measurement.of([180.0])}},
                          bandwidth={2: Measurement.of([30.0])}, page_fault_ms_per_mib=page_fault_ms_per_mib)


def use_cached(monkeypatch: pytest.MonkeyPatch, cache_dir: Path, machine: MachineProfile) -> None:
    """Make ``machine`` the cached machine profile, in ``cache_dir``, for one test."""
    monkeypatch.setenv("PROFILEDNN_CACHE_DIR", str(cache_dir))
    machine.save(cached_machine_path())

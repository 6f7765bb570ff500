"""Advice knows its numbers: ``bf16_native`` estimates its gain with the bf16/fp32 GEMM peak
ratio of this machine's cached profile (``profilednn machine``) when the Run was captured on
this CPU, says which figure it used and where it came from, and keeps the stated
assumption (2.0x) only where nothing was measured."""

from __future__ import annotations

from pathlib import Path

import pytest
from cpuprofiles import apply_profile, load_profile
from runfactory import make_run

from profilednn.analysis import Analysis, advise
from profilednn.analysis.precision_rules import ASSUMED_BF16_PEAK_RATIO
from profilednn.projection.machine import cached_machine_path
from profilednn.topology import cpu_topology

AMX = "intel-amx-2core"  # a recorded CPU with AMX: bf16 2,356 vs fp32 375 GFLOP/s


def _bf16_native(run) -> object:
    (adv,) = [a for a in advise(Analysis(run.path)) if a.rule == "bf16_native"]
    return adv


def _share(adv) -> float:
    return float(adv.evidence.split("take ")[1].split("%")[0])


def _captured_here(tmp_path: Path):
    topo = cpu_topology()
    here = {"cpu_model": topo.model_name, "isa_flags": sorted(topo.isa), "native_bf16": True}
    return make_run(tmp_path, native_bf16=True, extra_fingerprint=here)


@pytest.fixture
def amx_cpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """This process as the recorded AMX CPU, its machine file the cached profile."""
    monkeypatch.delenv("PROFILEDNN_CACHE_DIR", raising=False)
    profile = load_profile(AMX)
    apply_profile(monkeypatch, profile, tmp_path / "cache")
    return profile


def test_the_gain_uses_the_cached_machine_profile(amx_cpu, tmp_path: Path) -> None:
    peaks = amx_cpu.machine().peaks
    ratio = peaks["bf16"] / peaks["fp32"]
    adv = _bf16_native(_captured_here(tmp_path))
    assert f"measured bf16/fp32 GEMM peak ratio {ratio:.2f}x (this machine's profile)" in adv.evidence
    assert "from `profilednn machine` (measured 2026-11-25" in adv.evidence
    assert str(cached_machine_path()) in adv.evidence and "assumed" not in adv.evidence
    assert adv.estimated_gain_pct == pytest.approx(_share(adv) * (1 - 1 / ratio), abs=0.06)


def test_without_a_cached_profile_the_assumption_stays(amx_cpu, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROFILEDNN_CACHE_DIR", str(tmp_path / "empty-cache"))  # nothing cached there
    assert not cached_machine_path().exists()
    adv = _bf16_native(_captured_here(tmp_path))
    assert f"not measured for this Run (assumed {ASSUMED_BF16_PEAK_RATIO:.1f}x: no machine profile is cached " \
           "for this CPU; `profilednn machine` measures one" in adv.evidence
    assert adv.estimated_gain_pct == pytest.approx(_share(adv) * (1 - 1 / ASSUMED_BF16_PEAK_RATIO), abs=0.06)


def test_a_run_from_another_cpu_does_not_borrow_this_machines_profile(amx_cpu, tmp_path: Path) -> None:
    adv = _bf16_native(make_run(tmp_path, native_bf16=True))  # captured on "AMD EPYC (synthetic)"
    assert "assumed 2.0x: the Run was captured on another CPU; this machine's cached profile is of " \
           f"{cpu_topology().model_name}" in adv.evidence

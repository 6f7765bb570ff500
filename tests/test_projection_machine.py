"""The machine profile: file round trip, hand-written what-if files, scaling, the cache."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from profilednn.errors import InputError
from profilednn.projection import MachineProfile, Measurement, get_machine, load_machine_file
from profilednn.hardware.machine import cached_machine_path, measure_first_touch


def _profile() -> MachineProfile:
    return MachineProfile(
        name="test box", cpu_model="Test CPU", cores=4, sockets=1, numa_nodes=1,
        isa=("avx2", "fma"), native_dtypes=("fp32",),
        gemm={"fp32": {1: Measurement(90.0, 88.0, 91.0, 5), 4: Measurement(340.0, 330.0, 345.0, 5)}},
        bandwidth={1: Measurement(20.0, 19.0, 21.0, 5), 4: Measurement(40.0, 39.0, 41.0, 5)},
        torch="2.x", onednn="3.x", gemm_size=4096)


def test_machine_file_round_trip(tmp_path) -> None:
    prof = _profile()
    back = load_machine_file(prof.save(tmp_path / "m.toml"))
    assert back.cores == 4 and back.name == "test box" and back.native_dtypes == ("fp32",)
    assert back.gemm == prof.gemm and back.bandwidth == prof.bandwidth
    # a ceiling is the best repeat (noise only slows a kernel down), not the median
    assert back.gemm_peak_gflops() == 345.0 and back.bandwidth_gbs == 41.0
    assert MachineProfile.from_toml(tmp_path / "m.toml").to_dict() == back.to_dict()


def test_the_first_touch_cost_round_trips_and_old_files_load_without_it(tmp_path) -> None:
    prof = _profile()
    assert "page_fault_ms_per_mib" not in prof.to_dict()  # an old profile: no key, still loads
    assert load_machine_file(prof.save(tmp_path / "old.toml")).page_fault_ms_per_mib is None
    prof.page_fault_ms_per_mib = 0.155
    back = load_machine_file(prof.save(tmp_path / "new.toml"))
    assert back.page_fault_ms_per_mib == 0.155 and back.to_dict()["page_fault_ms_per_mib"] == 0.155
    assert "page_fault_ms_per_mib = 0.155" in (tmp_path / "new.toml").read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text("cores = 4\nbandwidth_gbs = 10.0\npage_fault_ms_per_mib = -1.0\n[peak_gflops]\nfp32 = 100.0\n")
    with pytest.raises(InputError, match="page_fault_ms_per_mib must be a number >= 0"):
        load_machine_file(bad)


def test_measuring_the_first_touch_cost_gives_a_non_negative_figure() -> None:
    cost = measure_first_touch(1, mbytes=2, repeats=3, blocks=2)
    assert isinstance(cost, float) and math.isfinite(cost) and cost >= 0.0


def test_first_touch_faults_fresh_pages_even_where_malloc_would_reuse_memory() -> None:
    # glibc told to map nothing (as the allocator recipe does): a malloc'd "fresh" buffer
    # would be reused heap memory; the measurement maps its own regions, so every fill of
    # its 2 warm-up and 3 x 2 timed repeats faults in all 512 pages of 2 MiB
    # (a first call loads torch's code pages, which fault too; the second is counted)
    code = ("import resource; from profilednn.hardware.machine import measure_first_touch\n"
            "measure_first_touch(1, mbytes=2, repeats=3, blocks=2)\n"
            "f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
            "measure_first_touch(1, mbytes=2, repeats=3, blocks=2)\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)")
    env = {**os.environ, "GLIBC_TUNABLES": "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1099511627776"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    pages = 2 * 2**20 // os.sysconf("SC_PAGE_SIZE")
    assert int(out.split()[-1]) >= 0.9 * 8 * pages


def test_unmeasured_thread_counts_scale_linearly_and_stop_at_the_cores() -> None:
    prof = _profile()
    assert prof.gemm_peak_gflops("fp32", 2) == pytest.approx(182.0)  # from 1 thread
    assert prof.gemm_peak_gflops("f32", 16) == 345.0  # no more than the physical cores
    assert prof.bandwidth_at(2) == 21.0  # bandwidth is not scaled up from fewer threads
    with pytest.raises(InputError, match="bf16"):
        prof.gemm_peak_gflops("bf16")


def test_hand_written_what_if_file(tmp_path) -> None:
    path = tmp_path / "big.toml"
    path.write_text('name = "big server"\ncores = 56\nbandwidth_gbs = 250.0\n'
                    "[peak_flops]\nfp32 = 6.0e12\nbf16 = 24.0e12\n")
    prof = load_machine_file(path)
    assert prof.source == "file" and prof.native_dtypes == ("fp32", "bf16")
    assert prof.gemm_peak_gflops("bf16") == pytest.approx(24000.0)
    assert prof.gemm_peak_gflops("fp32", 28) == pytest.approx(3000.0)
    assert prof.bandwidth_gbs == 250.0
    assert any("linearly" in a for a in prof.assumptions)


@pytest.mark.parametrize("text,match", [
    ("cores = [", "cannot read"),
    ("bandwidth_gbs = 10.0\n[peak_gflops]\nfp32 = 1.0\n", "cores"),
    ("cores = 4\nbandwidth_gbs = 10.0\n", "peak"),
    ("cores = 4\n[peak_gflops]\nfp32 = 100.0\n", "bandwidth"),
    ("cores = 4\nbandwidth_gbs = -1\n[peak_gflops]\nfp32 = 100.0\n", "positive"),
])
def test_bad_machine_files_say_what_is_wrong(tmp_path, text, match) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(InputError, match=match):
        load_machine_file(path)
    with pytest.raises(InputError, match="no such machine file"):
        load_machine_file(tmp_path / "missing.toml")


def test_get_machine_reads_its_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PROFILEDNN_CACHE_DIR", str(tmp_path))
    cached = _profile()
    cached.save(cached_machine_path())
    prof = get_machine()
    assert prof.name == "test box" and prof.gemm_peak_gflops() == 345.0
    assert prof.topology is not None  # this machine's live topology
    # cached before the first-touch cost was measured: measured now, and saved
    assert prof.page_fault_ms_per_mib is not None and prof.page_fault_ms_per_mib >= 0.0
    assert load_machine_file(cached_machine_path()).page_fault_ms_per_mib == round(prof.page_fault_ms_per_mib, 4)


def test_a_profile_measured_under_load_is_measured_again(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PROFILEDNN_CACHE_DIR", str(tmp_path))
    starved = _profile()
    starved.gemm = {"fp32": {4: Measurement(0.001, 0.001, 0.001, 1)}}
    starved.background_load_pct = 95.0
    assert starved.contended and any("idle machine" in a for a in starved.assumptions)
    starved.save(cached_machine_path())
    prof = get_machine()
    assert prof.name != "test box" and prof.gemm_peak_gflops() > 0.001
    assert load_machine_file(cached_machine_path()).gemm_peak_gflops() == prof.gemm_peak_gflops()


def test_a_profile_measured_with_a_too_small_gemm_is_measured_again(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PROFILEDNN_CACHE_DIR", str(tmp_path))
    small = _profile()
    small.gemm_size = 1024  # the old size: short calls stop short of the peak
    small.save(cached_machine_path())
    prof = get_machine()
    assert prof.name != "test box" and prof.gemm_size >= 2048
    assert load_machine_file(cached_machine_path()).gemm_size == prof.gemm_size


def test_measuring_this_machine(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PROFILEDNN_CACHE_DIR", str(tmp_path))
    prof = get_machine(refresh=True)
    assert cached_machine_path().is_file()
    assert prof.cores >= 1 and prof.gemm_peak_gflops() > 0 and prof.bandwidth_gbs > 0
    assert prof.page_fault_ms_per_mib is not None and math.isfinite(prof.page_fault_ms_per_mib)
    assert set(prof.gemm) == set(prof.native_dtypes)  # no peak for an emulated dtype
    for table in prof.gemm.values():
        for m in table.values():
            assert m.min <= m.median <= m.max

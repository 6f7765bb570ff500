"""The CPU topology read from sysfs: consistent counts, CPU-list parsing, native dtypes,
caches; the recorded CPUs of tests/cpus; which reduced dtypes pay."""

from __future__ import annotations

import json
import os

import pytest
from cpuprofiles import CPUS, load_profile, profile_names

from profilednn.errors import InputError
from profilednn.topology import (Cache, Core, CpuTopology, cpu_topology, dtype_speed, size_bytes,
                                 topology_from_cpu_profile, topology_from_dict)
from profilednn.topology import sysfs
from profilednn.topology.sysfs import _cpu_list, _detected_caches


@pytest.mark.real_cpu
def test_topology_matches_the_cpus_this_process_may_use() -> None:
    topo = cpu_topology()
    allowed = sorted(os.sched_getaffinity(0))
    assert sorted(cpu for core in topo.cores for cpu in core.cpus) == allowed
    assert topo.logical_cpus == len(allowed)
    assert 1 <= topo.sockets <= topo.physical_cores <= topo.logical_cpus
    assert topo.numa_nodes >= 1
    assert len(topo.first_cpus()) == topo.physical_cores
    assert "fp32" in topo.native_dtypes
    assert topo.to_dict()["physical_cores"] == topo.physical_cores


def test_cpu_list_parsing() -> None:
    assert _cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert _cpu_list("") == []


def test_two_socket_grouping_and_native_bf16() -> None:
    cores = tuple(Core(socket=s, core=c, node=s, cpus=(s * 4 + c, s * 4 + c + 8))
                  for s in (0, 1) for c in range(4))
    topo = CpuTopology("test", cores, frozenset({"avx512f", "avx512_bf16"}))
    assert (topo.sockets, topo.numa_nodes, topo.physical_cores, topo.logical_cpus) == (2, 2, 8, 16)
    assert topo.threads_per_core == 2
    assert [c.cpus[0] for c in topo.cores_of_socket(1)] == [4, 5, 6, 7]
    assert topo.first_cpus() == [0, 1, 2, 3, 4, 5, 6, 7]
    assert topo.native_dtypes == ("fp32", "bf16")
    assert CpuTopology("avx2", cores, frozenset({"avx2", "fma"})).native_dtypes == ("fp32",)


def test_cache_sizes_as_sysfs_and_lscpu_write_them() -> None:
    assert size_bytes("48K\n") == 48 << 10 and size_bytes("491520K") == 480 << 20
    assert size_bytes("96 KiB") == 96 << 10 and size_bytes("4 MiB") == 4 << 20 and size_bytes("1.5 MiB") == 3 << 19
    with pytest.raises(ValueError, match="cache size"):
        size_bytes("lots")


def _index(root, n: int, level: int, kind: str, size: str, shared: str) -> None:
    d = root / "cpu0" / "cache" / f"index{n}"
    d.mkdir(parents=True)
    for name, text in (("level", str(level)), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
        (d / name).write_text(text + "\n")


def test_caches_come_from_sysfs_as_the_guest_sees_them(tmp_path, monkeypatch) -> None:
    """The Intel AMX guest's sysfs: per-core L1/L2 and the host's 480 MiB L3 shared by both CPUs."""
    for n, args in enumerate([(1, "Data", "48K", "0"), (1, "Instruction", "64K", "0"),
                              (2, "Unified", "2048K", "0"), (3, "Unified", "491520K", "0-1")]):
        _index(tmp_path, n, *args)
    monkeypatch.setattr(sysfs, "SYS_CPU", tmp_path)
    topo = CpuTopology("guest", (Core(0, 0, 0, (0,)), Core(0, 1, 0, (1,))), caches=_detected_caches(0))
    assert topo.caches == (Cache(1, "Data", 48 << 10, 1), Cache(1, "Instruction", 64 << 10, 1),
                           Cache(2, "Unified", 2 << 20, 1), Cache(3, "Unified", 480 << 20, 2))
    assert (topo.llc_bytes, topo.cache_bytes(1), topo.cache_bytes(2), topo.cache_bytes(4)) == (
        480 << 20, 48 << 10, 2 << 20, None)


def test_caches_round_trip_and_files_without_them_still_load() -> None:
    topo = CpuTopology("t", (Core(0, 0, 0, (0,)),), frozenset({"avx2"}), (Cache(3, "Unified", 32 << 20, 8),))
    assert topology_from_dict(json.loads(json.dumps(topo.to_dict()))) == topo
    old = {k: v for k, v in topo.to_dict().items() if k != "caches"}
    assert topology_from_dict(old).caches == () and topology_from_dict(old).llc_bytes is None
    with pytest.raises(InputError, match="caches must be a list"):
        topology_from_dict({**old, "caches": "32M"})


@pytest.mark.parametrize("name", profile_names())
def test_each_recorded_cpu_loads_whole(name: str) -> None:
    profile = load_profile(name)
    topo, machine = profile.topology, profile.machine()
    assert topo.physical_cores == machine.cores == 2 and topo.model_name == machine.cpu_model
    assert set(machine.isa) <= topo.isa and set(machine.gemm) <= set(topo.native_dtypes)
    assert topo.cache_bytes(1) and topo.cache_bytes(2) and topo.llc_bytes == topo.cache_bytes(3)
    assert next(c for c in topo.caches if c.level == 3).shared_cpus == 2


def test_recorded_cpus_report_what_the_project_met() -> None:
    intel, zen3, zen4 = (load_profile(n).topology for n in ("intel-amx-2core", "amd-zen3-2core", "amd-zen4-2core"))
    assert intel.llc_bytes == 480 << 20 and intel.native_dtypes == ("fp32", "bf16", "fp16")
    assert zen3.llc_bytes == 32 << 20 and zen3.native_dtypes == ("fp32",) and "avx512f" not in zen3.isa
    assert zen4.native_dtypes == ("fp32", "bf16") and "amx_bf16" not in zen4.isa


def test_a_profile_without_its_files_names_the_ones_there(tmp_path) -> None:
    with pytest.raises(InputError, match="intel-amx-2core"):
        topology_from_cpu_profile(CPUS, "sparc")
    (tmp_path / "x.cpuinfo.txt").write_text("flags : avx2\n")
    (tmp_path / "x.lscpu.txt").write_text("CPU(s): 2\n")
    with pytest.raises(InputError, match="Socket"):
        topology_from_cpu_profile(tmp_path, "x")


def test_an_old_lscpu_without_instance_counts_reads_one_instance(tmp_path) -> None:
    (tmp_path / "old.cpuinfo.txt").write_text("model name : Old Xeon\nflags : avx2 fma\n")
    (tmp_path / "old.lscpu.txt").write_text("CPU(s): 4\nThread(s) per core: 2\nCore(s) per socket: 2\n"
                                            "Socket(s): 1\nL1d cache: 32K\nL3 cache: 8192K\n")
    topo = topology_from_cpu_profile(tmp_path, "old")
    assert (topo.physical_cores, topo.logical_cpus, topo.llc_bytes, topo.cache_bytes(1)) == (2, 4, 8 << 20, 32 << 10)


def test_native_is_not_faster_without_a_matrix_unit_or_a_measured_peak() -> None:
    """The Intel AMX guest lists fp16 as native (avx512_fp16) yet runs its GEMM below fp32."""
    intel, zen4 = load_profile("intel-amx-2core"), load_profile("amd-zen4-2core")
    peaks = intel.machine().peaks
    fp16 = dtype_speed("fp16", intel.topology.isa, peaks)
    assert (fp16.faster, fp16.basis) == (False, "measured") and "341 vs fp32 375 GFLOP/s (0.91x)" in fp16.reason
    assert dtype_speed("bf16", intel.topology.isa).basis == "matrix unit"  # AMX: no measurement needed
    assert dtype_speed("fp16", intel.topology.isa).basis == "unmeasured"  # avx512_fp16 alone says nothing
    assert dtype_speed("bf16", zen4.topology.isa, zen4.machine().peaks).faster
    assert not dtype_speed("bf16", zen4.topology.isa).faster  # vector BF16, nothing measured
    assert dtype_speed("bf16", {"avx2"}).basis == "emulated"
    assert intel.topology.faster_dtypes(peaks) == {"bf16": "measured bf16 GEMM 2,356 vs fp32 375 GFLOP/s (6.29x)"}
    assert not dtype_speed("bf16", intel.topology.isa, {"fp32": 375.0, "bf16": 300.0}).faster  # measured decides
    with pytest.raises(InputError, match="not a reduced-precision dtype"):
        dtype_speed("int8", intel.topology.isa)

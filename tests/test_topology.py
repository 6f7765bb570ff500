"""The CPU topology read from sysfs: consistent counts, CPU-list parsing, native dtypes."""

from __future__ import annotations

import os

from profilednn.topology import Core, CpuTopology, _cpu_list, cpu_topology


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

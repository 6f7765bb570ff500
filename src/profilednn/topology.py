"""The CPU's shape: cores, sockets, NUMA nodes and ISA flags, read from Linux sysfs.

Every job that plans threads or ranks (projection what-ifs, optimize's thread recipe,
distributed launch plans) needs the same answer to "which cores are there and how are
they grouped"; this module gives it without importing torch.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

SYS_CPU = Path("/sys/devices/system/cpu")
SYS_NODE = Path("/sys/devices/system/node")

# ISA flags worth reporting, as /proc/cpuinfo spells them.
ISA_FLAGS = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
    "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8", "amx_fp16",
)


@dataclass(frozen=True)
class Core:
    """One physical core: its socket, NUMA node and logical CPUs (hyperthreads)."""

    socket: int
    core: int
    node: int
    cpus: tuple[int, ...]


@dataclass(frozen=True)
class CpuTopology:
    """Cores grouped by socket and NUMA node, plus the CPU's ISA flags."""

    model_name: str
    cores: tuple[Core, ...]
    isa: frozenset[str] = field(default_factory=frozenset)

    @property
    def physical_cores(self) -> int:
        return len(self.cores)

    @property
    def logical_cpus(self) -> int:
        return sum(len(c.cpus) for c in self.cores)

    @property
    def sockets(self) -> int:
        return len({c.socket for c in self.cores})

    @property
    def numa_nodes(self) -> int:
        return len({c.node for c in self.cores})

    @property
    def threads_per_core(self) -> int:
        return max((len(c.cpus) for c in self.cores), default=1)

    def cores_of_socket(self, socket: int) -> list[Core]:
        return [c for c in self.cores if c.socket == socket]

    def cores_of_node(self, node: int) -> list[Core]:
        return [c for c in self.cores if c.node == node]

    def socket_ids(self) -> list[int]:
        return sorted({c.socket for c in self.cores})

    def node_ids(self) -> list[int]:
        return sorted({c.node for c in self.cores})

    def first_cpus(self) -> list[int]:
        """One logical CPU per physical core (the first hyperthread), socket by socket."""
        return [c.cpus[0] for c in sorted(self.cores, key=lambda c: (c.socket, c.core))]

    @property
    def native_dtypes(self) -> tuple[str, ...]:
        """Dtypes the CPU computes natively in GEMM/conv (fp32 always)."""
        out = ["fp32"]
        if self.isa & {"avx512_bf16", "amx_bf16"}:
            out.append("bf16")
        if self.isa & {"avx512_fp16", "amx_fp16"}:
            out.append("fp16")
        return tuple(out)

    def to_dict(self) -> dict:
        return {
            "model_name": self.model_name,
            "physical_cores": self.physical_cores,
            "logical_cpus": self.logical_cpus,
            "sockets": self.sockets,
            "numa_nodes": self.numa_nodes,
            "threads_per_core": self.threads_per_core,
            "isa": sorted(self.isa),
            "native_dtypes": list(self.native_dtypes),
            "cores": [
                {"socket": c.socket, "core": c.core, "node": c.node, "cpus": list(c.cpus)}
                for c in self.cores
            ],
        }


def _read_int(path: Path, default: int) -> int:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return default


def _cpu_list(text: str) -> list[int]:
    """Parse a Linux CPU list such as ``0-3,8,10-11``."""
    out: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            out.extend(range(int(lo), int(hi) + 1))
        else:
            out.append(int(part))
    return out


def _node_of_cpu() -> dict[int, int]:
    nodes: dict[int, int] = {}
    if SYS_NODE.is_dir():
        for d in sorted(SYS_NODE.glob("node[0-9]*")):
            try:
                cpus = _cpu_list((d / "cpulist").read_text())
            except OSError:
                continue
            for cpu in cpus:
                nodes[cpu] = int(d.name[4:])
    return nodes


def _cpuinfo() -> tuple[str, frozenset[str]]:
    model, flags = platform.processor() or "unknown", frozenset()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return model, flags
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model in ("unknown", "", "x86_64"):
            model = value.strip()
        elif key == "flags" and not flags:
            flags = frozenset(value.split())
    return model, flags


def cpu_topology() -> CpuTopology:
    """The CPUs this process may run on, grouped into physical cores, sockets and nodes."""
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(
        range(os.cpu_count() or 1))
    node_of = _node_of_cpu()
    groups: dict[tuple[int, int], list[int]] = {}
    for cpu in allowed:
        topo = SYS_CPU / f"cpu{cpu}" / "topology"
        socket = _read_int(topo / "physical_package_id", 0)
        core = _read_int(topo / "core_id", cpu)
        groups.setdefault((socket, core), []).append(cpu)
    cores = tuple(
        Core(socket=s, core=c, node=node_of.get(cpus[0], 0), cpus=tuple(sorted(cpus)))
        for (s, c), cpus in sorted(groups.items())
    )
    model, flags = _cpuinfo()
    return CpuTopology(model_name=model, cores=cores, isa=frozenset(f for f in ISA_FLAGS if f in flags))


__all__ = ["Core", "CpuTopology", "ISA_FLAGS", "cpu_topology"]

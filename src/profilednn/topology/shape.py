"""The CPU's shape as one value: physical cores grouped by socket and NUMA node, the caches
as the guest reports them, and the ISA flags (``CpuTopology``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .dtype_policy import BF16_MATRIX_FLAG, BF16_VECTOR_FLAG, DTYPE_ISA, REDUCED_DTYPES, faster_dtypes

# ISA flags worth reporting, as /proc/cpuinfo spells them.
ISA_FLAGS = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
    BF16_VECTOR_FLAG, "avx512_fp16", "avx_vnni", "amx_tile", BF16_MATRIX_FLAG, "amx_int8", "amx_fp16",
)


@dataclass(frozen=True)
class Core:
    """One physical core: its socket, NUMA node and logical CPUs (hyperthreads)."""

    socket: int
    core: int
    node: int
    cpus: tuple[int, ...]


@dataclass(frozen=True)
class Cache:
    """One cache as the guest reports it: level, kind (sysfs's ``Data``, ``Unified`` or
    ``Instruction``), size of one instance, and how many logical CPUs share that instance."""

    level: int
    kind: str
    size_bytes: int
    shared_cpus: int

    @property
    def holds_data(self) -> bool:
        return self.kind in ("Data", "Unified")


@dataclass(frozen=True)
class CpuTopology:
    """Cores grouped by socket and NUMA node, plus the CPU's caches and ISA flags."""

    model_name: str
    cores: tuple[Core, ...]
    isa: frozenset[str] = field(default_factory=frozenset)
    caches: tuple[Cache, ...] = ()

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
        """Dtypes the CPU's ISA computes natively in GEMM/conv (fp32 always). Native is not
        faster: ask :func:`dtype_speed` (or :meth:`faster_dtypes`) before advising one."""
        return ("fp32", *(d for d in REDUCED_DTYPES if self.isa & set(DTYPE_ISA[d])))

    def faster_dtypes(self, peaks: Mapping[str, float] | None = None) -> dict[str, str]:
        """The reduced-precision dtypes that pay on this CPU, each with its reason
        (``peaks``: measured GEMM GFLOP/s per dtype, fp32 included; see :func:`dtype_speed`)."""
        return faster_dtypes(self.isa, peaks)

    @property
    def llc_bytes(self) -> int | None:
        """The largest data or unified cache as reported (the host's L3 in some guests;
        :attr:`Cache.shared_cpus` says how many CPUs share it); None when none is known."""
        return max((c.size_bytes for c in self.caches if c.holds_data), default=None)

    def cache_bytes(self, level: int) -> int | None:
        """The data or unified cache of ``level`` (one instance), or None when not reported."""
        return max((c.size_bytes for c in self.caches if c.holds_data and c.level == level), default=None)

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
            "caches": [
                {"level": c.level, "kind": c.kind, "size_bytes": c.size_bytes, "shared_cpus": c.shared_cpus}
                for c in self.caches
            ],
        }


__all__ = ["Cache", "Core", "CpuTopology", "ISA_FLAGS"]

"""The CPU's shape: cores, sockets, NUMA nodes and ISA flags, read from Linux sysfs.

Every job that plans threads or ranks (projection what-ifs, optimize's thread recipe,
distributed launch plans) needs the same answer to "which cores are there and how are
they grouped"; this module gives it without importing torch.

Every ISA fact the jobs branch on comes from here, so a different CPU can be *injected*
(tests cover both branches anywhere; users ask "what would this advise on a CPU with
AMX?"): ``PROFILEDNN_TOPOLOGY=FILE`` (JSON or TOML: ``model_name``, ``isa``, and either
``cores`` as :meth:`CpuTopology.to_dict` writes them or ``physical_cores``/``sockets``/
``threads_per_core``) replaces the detected topology, and
``PROFILEDNN_CPU_FLAGS=+avx512_bf16,+amx_bf16,-avx2`` adds/removes ISA flags on top of it.
:func:`detected_topology` ignores both (what the silicon can execute: native builds).
"""

from __future__ import annotations

import json
import os
import platform
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

from .errors import InputError

SYS_CPU = Path("/sys/devices/system/cpu")
SYS_NODE = Path("/sys/devices/system/node")
ENV_TOPOLOGY = "PROFILEDNN_TOPOLOGY"  # a topology file that replaces the detected one
ENV_CPU_FLAGS = "PROFILEDNN_CPU_FLAGS"  # +flag/-flag edits of the ISA flags

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
    """The CPU every job reasons about: the detected one, unless one is injected.

    ``PROFILEDNN_TOPOLOGY`` and ``PROFILEDNN_CPU_FLAGS`` (see the module doc) are read on
    every call, so a test or a user can inject a CPU for one command.
    """
    path = os.environ.get(ENV_TOPOLOGY, "").strip()
    topo = load_topology(path) if path else detected_topology()
    edits = os.environ.get(ENV_CPU_FLAGS, "").strip()
    return with_cpu_flags(topo, edits) if edits else topo


def topology_injection() -> str | None:
    """What is injected (``"PROFILEDNN_CPU_FLAGS=+amx_bf16"``), or None for the detected CPU."""
    parts = [f"{k}={os.environ[k].strip()}" for k in (ENV_TOPOLOGY, ENV_CPU_FLAGS)
             if os.environ.get(k, "").strip()]
    return "; ".join(parts) or None


def with_cpu_flags(topo: CpuTopology, edits: str) -> CpuTopology:
    """``topo`` with ISA flags added (``+flag`` or ``flag``) or removed (``-flag``)."""
    isa = set(topo.isa)
    for item in edits.replace(" ", ",").split(","):
        item = item.strip().lower()
        if not item:
            continue
        name = item.lstrip("+-")
        if not name or not name.replace("_", "").isalnum():
            raise InputError(f"{ENV_CPU_FLAGS}: {item!r} is not an ISA flag; write e.g. "
                             "+avx512_bf16,+amx_bf16,-avx512f (names as /proc/cpuinfo spells them)")
        (isa.discard if item.startswith("-") else isa.add)(name)
    return replace(topo, isa=frozenset(isa))


def topology_from_dict(data: dict) -> CpuTopology:
    """A topology from :meth:`CpuTopology.to_dict`'s shape, or a short form with
    ``physical_cores`` (default 1), ``sockets`` (1) and ``threads_per_core`` (1)."""
    if not isinstance(data, dict):
        raise InputError("a topology must be a mapping with model_name, isa and cores")
    isa = data.get("isa", [])
    if isinstance(isa, str):
        isa = isa.replace(",", " ").split()
    if data.get("cores") and isinstance(data["cores"], list):
        cores = tuple(Core(socket=int(c.get("socket", 0)), core=int(c["core"]),
                           node=int(c.get("node", c.get("socket", 0))),
                           cpus=tuple(int(x) for x in c.get("cpus") or (c["core"],)))
                      for c in data["cores"])
    else:
        n, sockets = int(data.get("physical_cores", 1)), int(data.get("sockets", 1))
        tpc = int(data.get("threads_per_core", 1))
        if n < 1 or sockets < 1 or tpc < 1 or n % sockets:
            raise InputError(f"topology: physical_cores={n} must be a positive multiple of sockets={sockets}")
        per = n // sockets
        cores = tuple(Core(socket=i // per, core=i, node=i // per,
                           cpus=tuple(i + k * n for k in range(tpc))) for i in range(n))
    return CpuTopology(model_name=str(data.get("model_name") or "injected CPU"), cores=cores,
                       isa=frozenset(str(f).lower() for f in isa))


def load_topology(path: str | Path) -> CpuTopology:
    """Read a topology file (``.json`` or ``.toml``) written by hand or by ``to_dict``."""
    p = Path(path)
    try:
        text = p.read_text()
        data = tomllib.loads(text) if p.suffix.lower() == ".toml" else json.loads(text)
    except OSError as exc:
        raise InputError(f"{ENV_TOPOLOGY}: cannot read {p}: {exc.strerror or exc}") from exc
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise InputError(f"{ENV_TOPOLOGY}: {p} is not valid {'TOML' if p.suffix == '.toml' else 'JSON'}: {exc}"
                         ) from exc
    try:
        return topology_from_dict(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{ENV_TOPOLOGY}: {p}: {exc!r}; see CpuTopology.to_dict for the shape") from exc


def detected_topology() -> CpuTopology:
    """The CPUs this process may run on, grouped into physical cores, sockets and nodes
    (read from sysfs and /proc/cpuinfo; ignores any injection)."""
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


__all__ = ["Core", "CpuTopology", "ENV_CPU_FLAGS", "ENV_TOPOLOGY", "ISA_FLAGS", "cpu_topology",
           "detected_topology", "load_topology", "topology_from_dict", "topology_injection",
           "with_cpu_flags"]

"""The CPU's shape: cores, sockets, NUMA nodes, caches and ISA flags, read from Linux sysfs.

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
oneDNN's own cap, ``ONEDNN_MAX_CPU_ISA`` (e.g. ``AVX512_CORE_BF16`` turns AMX off, ``AVX2``
AVX-512 and native BF16), is software, not injection: :func:`cpu_topology` drops the flags
above it, since the kernels that would use them will not run.

Caches are reported as the guest sees them: a 2-core slice of a server may list the
host's whole L3 (a KVM guest of an Intel Xeon showed 480 MiB), so :attr:`Cache.shared_cpus`
says how many logical CPUs share each one. :func:`topology_from_cpu_profile` builds the
topology of a CPU from its recorded ``/proc/cpuinfo`` and ``lscpu`` (``tests/cpus/``).

"Native" is not "faster": :func:`dtype_speed` says whether a reduced-precision dtype pays
on a CPU (a measured GEMM peak above fp32's, or, unmeasured, a matrix unit), with the reason;
every job that advises, projects or tries a dtype as a speed-up asks it.
"""

from __future__ import annotations

import json
import os
import platform
import re
import tomllib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from .errors import InputError

SYS_CPU = Path("/sys/devices/system/cpu")
SYS_NODE = Path("/sys/devices/system/node")
ENV_TOPOLOGY = "PROFILEDNN_TOPOLOGY"  # a topology file that replaces the detected one
ENV_CPU_FLAGS = "PROFILEDNN_CPU_FLAGS"  # +flag/-flag edits of the ISA flags
# oneDNN's own cap on the ISA it dispatches to (the newer name first, as oneDNN reads them).
ENV_ONEDNN_MAX_ISA = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
# oneDNN's ISA levels as its ``dnnl_cpu_isa_t`` bit masks: a kernel for an ISA may run under a
# cap when every bit of the ISA's mask is in the cap's (the levels are not a total order:
# AVX512_CORE lacks AVX2_VNNI's bit). DEFAULT and ALL lift the cap.
ONEDNN_ISA_MASKS = {
    "SSE41": 0x1, "AVX": 0x3, "AVX2": 0x7, "AVX2_VNNI": 0xF, "AVX2_VNNI_2": 0x1F, "AVX512_CORE": 0x27,
    "AVX512_CORE_VNNI": 0x67, "AVX512_CORE_BF16": 0xE7, "AVX10_1_512": 0x1EF, "AVX512_CORE_FP16": 0x1EF,
    "AVX10_1_512_AMX": 0xFEF, "AVX512_CORE_AMX": 0xFEF, "AVX10_1_512_AMX_FP16": 0x1FEF,
    "AVX512_CORE_AMX_FP16": 0x1FEF,
}
ONEDNN_NO_CAP = ("DEFAULT", "ALL")
# The oneDNN ISA level that each reported flag's kernels need (flags oneDNN's GEMM and
# convolution kernels are chosen by; the others are left as reported).
FLAG_ONEDNN_ISA = {
    "avx": "AVX", "avx2": "AVX2", "fma": "AVX2", "avx_vnni": "AVX2_VNNI", "avx512f": "AVX512_CORE",
    "avx512bw": "AVX512_CORE", "avx512vl": "AVX512_CORE", "avx512_vnni": "AVX512_CORE_VNNI",
    "avx512_bf16": "AVX512_CORE_BF16", "avx512_fp16": "AVX512_CORE_FP16", "amx_tile": "AVX512_CORE_AMX",
    "amx_bf16": "AVX512_CORE_AMX", "amx_int8": "AVX512_CORE_AMX", "amx_fp16": "AVX512_CORE_AMX_FP16",
}

# ISA flags worth reporting, as /proc/cpuinfo spells them.
ISA_FLAGS = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
    "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8", "amx_fp16",
)
# Reduced-precision dtypes, the ISA flags that compute each natively, and its matrix unit.
REDUCED_DTYPES = ("bf16", "fp16")
DTYPE_ISA = {"bf16": ("avx512_bf16", "amx_bf16"), "fp16": ("avx512_fp16", "amx_fp16")}
MATRIX_UNIT = {"bf16": "amx_bf16", "fp16": "amx_fp16"}
# The one answer to "is BF16 native here" (the fingerprint, the advice and the dtype speed
# all ask it here). avx_ne_convert does not count: AVX-NE-CONVERT only converts between BF16
# and fp32, and oneDNN's BF16 compute kernels need AVX512_CORE_BF16 (avx512_bf16) or AMX
# (amx_bf16); without them oneDNN emulates BF16.
NATIVE_BF16_FLAGS: frozenset[str] = frozenset(DTYPE_ISA["bf16"])
# The least a CPU with native BF16 has: what a Run that only says ``native_bf16: true`` counts as.
BF16_VECTOR_FLAG = DTYPE_ISA["bf16"][0]
# The ISA flags a Run's fingerprint records (ISA_FLAGS and sse4_1, avx512dq), in the order
# Runs have always stored them.
FINGERPRINT_ISA_FLAGS = (
    "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c",
    "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16",
    "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8", "amx_fp16",
)
# A measured GEMM peak must beat fp32's by this much to pay for the dtype's rounding
# (fp16 on the Intel AMX guest: 341 vs 375 GFLOP/s, 0.91x; bf16 on Zen 4: 2.2x).
MIN_GEMM_SPEEDUP = 1.1
CACHE_KINDS = ("Data", "Unified", "Instruction")


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


@dataclass(frozen=True)
class DtypeSpeed:
    """Whether computing in a reduced-precision dtype pays on a CPU, and why.

    ``basis``: ``measured`` (GEMM peaks decided), ``matrix unit`` (AMX for it, nothing
    measured), ``unmeasured`` (vector ISA only, no peak to show it beats fp32) or ``emulated``.
    """

    dtype: str
    faster: bool
    basis: str
    reason: str


def dtype_speed(dtype: str, isa: Collection[str], peaks: Mapping[str, float] | None = None) -> DtypeSpeed:
    """Whether ``dtype`` (bf16 or fp16) pays on a CPU with ``isa`` flags and measured GEMM
    ``peaks`` (GFLOP/s per dtype, fp32 included; None when not measured).

    Measured peaks decide: it pays where its GEMM peak beats fp32's by
    :data:`MIN_GEMM_SPEEDUP`. Unmeasured, it pays where the ISA has a matrix unit for it
    (amx_bf16, amx_fp16); a vector ISA alone does not say (avx512_fp16 on the Intel AMX
    guest ran fp16 GEMM slower than fp32).
    """
    if dtype not in REDUCED_DTYPES:
        raise InputError(f"{dtype!r} is not a reduced-precision dtype; ask about one of "
                         f"{', '.join(REDUCED_DTYPES)}")
    peaks, flags = peaks or {}, {str(f).lower() for f in isa}
    if peaks.get(dtype) and peaks.get("fp32"):
        return _measured_speed(dtype, float(peaks[dtype]), float(peaks["fp32"]))
    if MATRIX_UNIT[dtype] in flags:
        return DtypeSpeed(dtype, True, "matrix unit", f"{MATRIX_UNIT[dtype]}: a matrix unit computes {dtype}")
    vector = [f for f in DTYPE_ISA[dtype] if f in flags]
    if vector:
        return DtypeSpeed(dtype, False, "unmeasured",
                          f"{', '.join(vector)} computes {dtype} in vector units, but no {dtype} GEMM peak "
                          "was measured to show it beats fp32 (`profilednn machine` measures it)")
    return DtypeSpeed(dtype, False, "emulated",
                      f"no native {dtype} (no {' or '.join(DTYPE_ISA[dtype])}): it would be emulated, "
                      "many times slower than fp32")


def _measured_speed(dtype: str, peak: float, fp32: float) -> DtypeSpeed:
    ratio = peak / fp32
    text = f"measured {dtype} GEMM {peak:,.0f} vs fp32 {fp32:,.0f} GFLOP/s ({ratio:.2f}x)"
    if ratio < MIN_GEMM_SPEEDUP:
        text += f": below the {MIN_GEMM_SPEEDUP:.1f}x that pays for its rounding"
    return DtypeSpeed(dtype, ratio >= MIN_GEMM_SPEEDUP, "measured", text)


def bf16_tier(isa: Collection[str]) -> str:
    """What the CPU computes BF16 GEMMs with: "amx" (a matrix unit), "avx512_bf16" (vector
    instructions only) or "none" (emulated) -- the class the speed targets are set per."""
    if MATRIX_UNIT["bf16"] in isa:
        return "amx"
    native = [f for f in DTYPE_ISA["bf16"] if f in isa]
    return native[0] if native else "none"


def has_native_bf16(isa: Collection[str]) -> bool:
    """Whether a CPU with ``isa`` flags computes BF16 natively (:data:`NATIVE_BF16_FLAGS`);
    without it oneDNN emulates BF16 and training runs many times slower than fp32."""
    return bool(NATIVE_BF16_FLAGS & {str(f).lower() for f in isa})


def faster_dtypes(isa: Collection[str], peaks: Mapping[str, float] | None = None) -> dict[str, str]:
    """``{dtype: reason}`` for each reduced-precision dtype that pays (see :func:`dtype_speed`)."""
    speeds = (dtype_speed(d, isa, peaks) for d in REDUCED_DTYPES)
    return {s.dtype: s.reason for s in speeds if s.faster}


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


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*$", re.I)


def size_bytes(text: str) -> int:
    """``48K`` (sysfs), ``96 KiB`` or ``4 MiB`` (lscpu) -> bytes (powers of 1024)."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a cache size such as 48K or 96 KiB")
    return int(float(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " "))


def _sysfs_cache(index: Path) -> Cache | None:
    """One ``cpuN/cache/indexM`` directory, or None when it cannot be read."""
    try:
        kind = (index / "type").read_text().strip()
        return Cache(level=int((index / "level").read_text()), kind=kind,
                     size_bytes=size_bytes((index / "size").read_text()),
                     shared_cpus=max(1, len(_cpu_list((index / "shared_cpu_list").read_text()))))
    except (OSError, ValueError):
        return None


def _detected_caches(cpu: int) -> tuple[Cache, ...]:
    """The caches of logical CPU ``cpu`` as sysfs reports them, L1 first."""
    found = (_sysfs_cache(d) for d in (SYS_CPU / f"cpu{cpu}" / "cache").glob("index[0-9]*"))
    return tuple(sorted((c for c in found if c), key=lambda c: (c.level, CACHE_KINDS.index(c.kind)
                                                                  if c.kind in CACHE_KINDS else 9)))


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
    """The CPU every job reasons about: the detected one, unless one is injected, with the
    flags above a oneDNN ISA cap removed.

    ``PROFILEDNN_TOPOLOGY`` and ``PROFILEDNN_CPU_FLAGS`` (see the module doc) are read on
    every call, so a test or a user can inject a CPU for one command. ``ONEDNN_MAX_CPU_ISA``
    (or ``DNNL_MAX_CPU_ISA``) caps what oneDNN dispatches to: with ``AVX512_CORE_BF16`` on a
    CPU with AMX, BF16 convolutions and matmuls run without AMX, so every job must reason as
    if the CPU had none (its dtype decisions, peaks and advice).
    """
    topo = _injected_topology(os.environ)
    cap = onednn_isa_cap()
    return replace(topo, isa=capped_isa(topo.isa, cap[1])) if cap else topo


def _injected_topology(env: Mapping[str, str]) -> CpuTopology:
    """The detected CPU, or the one ``env`` injects, before any oneDNN cap."""
    path = env.get(ENV_TOPOLOGY, "").strip()
    topo = load_topology(path) if path else detected_topology()
    edits = env.get(ENV_CPU_FLAGS, "").strip()
    return with_cpu_flags(topo, edits) if edits else topo


def onednn_isa_cap(env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """``(variable, LEVEL)`` when oneDNN's ISA is capped (``ONEDNN_MAX_CPU_ISA=avx2`` ->
    ``("ONEDNN_MAX_CPU_ISA", "AVX2")``); None when unset, ``DEFAULT``/``ALL``, or a value
    oneDNN does not know (it ignores those: see :func:`isa_cap_note`)."""
    env = os.environ if env is None else env
    for variable in ENV_ONEDNN_MAX_ISA:
        value = env.get(variable, "").strip().upper()
        if value:
            return (variable, value) if value in ONEDNN_ISA_MASKS else None
    return None


def capped_isa(isa: Collection[str], level: str) -> frozenset[str]:
    """``isa`` without the flags whose oneDNN kernels a cap at ``level`` forbids."""
    cap = ONEDNN_ISA_MASKS[level.upper()]
    return frozenset(f for f in isa
                     if f not in FLAG_ONEDNN_ISA or ONEDNN_ISA_MASKS[FLAG_ONEDNN_ISA[f]] & ~cap == 0)


def isa_cap_note(env: Mapping[str, str] | None = None) -> str | None:
    """One line on oneDNN's ISA cap and the flags it takes away, or on a cap value oneDNN
    ignores; None when nothing caps it."""
    env = os.environ if env is None else env
    for variable in ENV_ONEDNN_MAX_ISA:
        value = env.get(variable, "").strip()
        if not value:
            continue
        if value.upper() in ONEDNN_NO_CAP:
            return None
        if value.upper() not in ONEDNN_ISA_MASKS:
            return (f"{variable}={value} is not a oneDNN ISA level ({', '.join(ONEDNN_ISA_MASKS)}); "
                    "oneDNN ignores it and uses every ISA the CPU has")
        removed = sorted(isa_removed_by_cap(env))
        return (f"{variable}={value.upper()} caps oneDNN's kernels: "
                + (f"{', '.join(removed)} not used" if removed else "no flag of this CPU is above it"))
    return None


def isa_removed_by_cap(env: Mapping[str, str] | None = None) -> frozenset[str]:
    """The flags of this (possibly injected) CPU that oneDNN's ISA cap takes away; empty
    when nothing caps it."""
    env = os.environ if env is None else env
    cap = onednn_isa_cap(env)
    if cap is None:
        return frozenset()
    isa = _injected_topology(env).isa
    return isa - capped_isa(isa, cap[1])


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
                       isa=frozenset(str(f).lower() for f in isa), caches=_caches_from(data.get("caches")))


def _caches_from(rows: object) -> tuple[Cache, ...]:
    """``to_dict``'s ``caches`` list back into Caches (absent in older files: none)."""
    if not rows:
        return ()
    if not isinstance(rows, list):
        raise InputError("topology: caches must be a list of {level, kind, size_bytes, shared_cpus}")
    return tuple(Cache(level=int(r["level"]), kind=str(r["kind"]), size_bytes=int(r["size_bytes"]),
                       shared_cpus=int(r.get("shared_cpus", 1))) for r in rows)


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
    return CpuTopology(model_name=model, cores=cores, isa=frozenset(f for f in ISA_FLAGS if f in flags),
                       caches=_detected_caches(allowed[0] if allowed else 0))


# ------------------------------------------------------------------ recorded CPU profiles
LSCPU_CACHES = {"L1d": (1, "Data"), "L1i": (1, "Instruction"), "L2": (2, "Unified"), "L3": (3, "Unified"),
                "L4": (4, "Unified")}
_INSTANCES = re.compile(r"^(.*?)\s*\((\d+) instances?\)\s*$")


def _key_values(text: str) -> dict[str, str]:
    """``key : value`` lines (``/proc/cpuinfo``, ``lscpu``) -> dict; the first of each key wins."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, found, value = line.partition(":")
        if found and key.strip() and not line.lstrip().startswith("#"):
            out.setdefault(key.strip(), value.strip())
    return out


def _lscpu_caches(lscpu: dict[str, str], logical_cpus: int) -> tuple[Cache, ...]:
    """``L2 cache: 4 MiB (2 instances)`` -> one Cache of 2 MiB shared by logical/2 CPUs.
    An older lscpu without an instance count is read as one instance of that size."""
    out = []
    for name, (level, kind) in LSCPU_CACHES.items():
        value = lscpu.get(f"{name} cache")
        if not value:
            continue
        m = _INSTANCES.match(value)
        total, instances = (m.group(1), int(m.group(2))) if m else (value, 1)
        out.append(Cache(level, kind, size_bytes(total) // max(1, instances),
                         max(1, logical_cpus // max(1, instances))))
    return tuple(out)


def _profile_text(directory: Path, name: str, suffix: str) -> str:
    path = directory / f"{name}.{suffix}"
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        known = sorted(p.name.split(".")[0] for p in directory.glob("*.lscpu.txt"))
        raise InputError(f"CPU profile {name!r}: cannot read {path} ({exc.strerror or exc}); profiles there: "
                         f"{', '.join(known) or 'none'} (each needs NAME.cpuinfo.txt and NAME.lscpu.txt)"
                         ) from exc


def topology_from_cpu_profile(directory: str | Path, name: str) -> CpuTopology:
    """The topology of a recorded CPU: model and ISA flags from ``NAME.cpuinfo.txt`` (one
    processor's ``/proc/cpuinfo`` block), cores, sockets and caches from ``NAME.lscpu.txt``."""
    directory = Path(directory)
    cpuinfo = _key_values(_profile_text(directory, name, "cpuinfo.txt"))
    lscpu = _key_values(_profile_text(directory, name, "lscpu.txt"))
    try:
        sockets, per_socket = int(lscpu["Socket(s)"]), int(lscpu["Core(s) per socket"])
        tpc, logical = int(lscpu.get("Thread(s) per core", "1")), int(lscpu["CPU(s)"])
    except (KeyError, ValueError) as exc:
        raise InputError(f"CPU profile {name!r}: {name}.lscpu.txt lacks {exc} (needs CPU(s), Socket(s), "
                         "Core(s) per socket as lscpu prints them)") from exc
    flags = set((cpuinfo.get("flags") or lscpu.get("Flags", "")).split())
    short = {"model_name": cpuinfo.get("model name") or lscpu.get("Model name") or name,
             "physical_cores": sockets * per_socket, "sockets": sockets, "threads_per_core": tpc,
             "isa": [f for f in ISA_FLAGS if f in flags]}
    topo = topology_from_dict(short)
    return replace(topo, caches=_lscpu_caches(lscpu, logical))


__all__ = ["Cache", "Core", "CpuTopology", "DTYPE_ISA", "DtypeSpeed", "ENV_CPU_FLAGS", "ENV_ONEDNN_MAX_ISA",
           "ENV_TOPOLOGY", "BF16_VECTOR_FLAG", "FINGERPRINT_ISA_FLAGS", "FLAG_ONEDNN_ISA", "ISA_FLAGS", "NATIVE_BF16_FLAGS",
           "bf16_tier", "has_native_bf16", "ONEDNN_ISA_MASKS", "capped_isa", "isa_cap_note",
           "isa_removed_by_cap", "onednn_isa_cap", "MATRIX_UNIT", "MIN_GEMM_SPEEDUP", "REDUCED_DTYPES", "cpu_topology",
           "detected_topology", "dtype_speed", "faster_dtypes", "load_topology", "size_bytes",
           "topology_from_cpu_profile", "topology_from_dict", "topology_injection", "with_cpu_flags"]

"""The topology of a recorded CPU (``tests/cpus/``): its ``/proc/cpuinfo`` block and its
``lscpu`` output, read back into a ``CpuTopology``."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from ..errors import InputError
from .injection import topology_from_dict
from .shape import ISA_FLAGS, Cache, CpuTopology
from .sysfs import size_bytes

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


__all__ = ["topology_from_cpu_profile"]

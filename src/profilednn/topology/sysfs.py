"""The detected CPU: cores, sockets, NUMA nodes and caches from Linux sysfs, model and ISA
flags from ``/proc/cpuinfo`` (:func:`detected_topology`; no injection applies here)."""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path

from .shape import ISA_FLAGS, Cache, Core, CpuTopology

SYS_CPU = Path("/sys/devices/system/cpu")
SYS_NODE = Path("/sys/devices/system/node")
CACHE_KINDS = ("Data", "Unified", "Instruction")


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


__all__ = ["CACHE_KINDS", "SYS_CPU", "SYS_NODE", "detected_topology", "size_bytes"]

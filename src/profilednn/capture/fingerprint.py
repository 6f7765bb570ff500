"""The machine and software fingerprint stored in every Run's manifest.

Two Runs are only comparable when their fingerprints say so: CPU model, cores, sockets,
NUMA nodes, ISA flags, library versions, thread counts and the environment variables
that change how oneDNN and OpenMP behave.
"""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path
from typing import Any

import psutil

from ..hardware.machine import onednn_version
from ..topology import FINGERPRINT_ISA_FLAGS
from ..topology import has_native_bf16 as isa_has_native_bf16
_ENV_PREFIXES = ("OMP_", "KMP_", "ONEDNN_", "DNNL_", "MKL_", "GOMP_", "TORCH_")
_ENV_EXACT = ("LD_PRELOAD", "MALLOC_CONF", "JE_MALLOC_CONF", "TCMALLOC_RELEASE_RATE", "GLIBC_TUNABLES",
              "MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_")


def _cpuinfo() -> tuple[str, set[str]]:
    model, flags = platform.processor() or "unknown", set()
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return model, flags
    m = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    if m:
        model = m.group(1).strip()
    f = re.search(r"^flags\s*:\s*(.+)$", text, re.M)
    if f:
        flags = set(f.group(1).split())
    return model, flags


def _sockets() -> int:
    ids = set()
    for p in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/topology/physical_package_id"):
        try:
            ids.add(p.read_text().strip())
        except OSError:
            continue
    return max(1, len(ids))


def _numa_nodes() -> int:
    nodes = list(Path("/sys/devices/system/node").glob("node[0-9]*"))
    return max(1, len(nodes))


def isa_flags() -> list[str]:
    """The deep-learning-relevant ISA flags this CPU reports (an injected CPU's flags when
    ``PROFILEDNN_TOPOLOGY`` / ``PROFILEDNN_CPU_FLAGS`` is set, without those above
    ``ONEDNN_MAX_CPU_ISA``'s cap; see ``profilednn.topology``)."""
    from ..topology import cpu_topology, onednn_isa_cap, topology_injection

    if topology_injection() or onednn_isa_cap():
        return sorted(cpu_topology().isa)
    _, flags = _cpuinfo()
    return [f for f in FINGERPRINT_ISA_FLAGS if f in flags]


def has_native_bf16(flags: list[str] | set[str] | None = None) -> bool:
    """True when the CPU (this one's flags unless given) computes BF16 natively: the
    topology's answer (``profilednn.topology.has_native_bf16``).

    Without it oneDNN emulates BF16 and training is many times slower than fp32.
    """
    return isa_has_native_bf16(isa_flags() if flags is None else flags)


def _injection() -> str | None:
    from ..topology import topology_injection

    return topology_injection()


def detect_allocator(env: dict[str, str] | None = None) -> str:
    """Which malloc the process runs with, judged from LD_PRELOAD and loaded libraries."""
    env = dict(os.environ if env is None else env)
    preload = env.get("LD_PRELOAD", "")
    maps = ""
    try:
        maps = Path("/proc/self/maps").read_text(errors="replace")
    except OSError:
        pass
    for name in ("jemalloc", "tcmalloc", "mimalloc"):
        if name in preload or f"lib{name}" in maps:
            return name
    return "glibc-caching" if glibc_caching(env) else "default"


def glibc_caching(env: dict[str, str] | None = None) -> bool:
    """Whether ``env`` (default: this process's) tells glibc's malloc to keep freed memory
    (no mmap for large buffers: ``glibc.malloc.mmap_max=0`` or ``MALLOC_MMAP_MAX_=0``)."""
    env = os.environ if env is None else env
    tunables = dict(item.split("=", 1) for item in env.get("GLIBC_TUNABLES", "").split(":") if "=" in item)
    return tunables.get("glibc.malloc.mmap_max") == "0" or env.get("MALLOC_MMAP_MAX_") == "0"


def fingerprint() -> dict[str, Any]:
    """The fingerprint dict stored under ``manifest["fingerprint"]``."""
    import torch

    model, _ = _cpuinfo()
    flags = isa_flags()
    env = {k: v for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES) or k in _ENV_EXACT}
    return {
        "cpu_model": model,
        "cores": psutil.cpu_count(logical=False) or os.cpu_count(),
        "logical_cpus": psutil.cpu_count(logical=True) or os.cpu_count(),
        "affinity_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "sockets": _sockets(),
        "numa_nodes": _numa_nodes(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "isa_flags": flags,
        "native_bf16": has_native_bf16(flags),
        **({"isa_injected": injected} if (injected := _injection()) else {}),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "onednn": onednn_version(),
        "mkldnn_enabled": bool(torch.backends.mkldnn.enabled),
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "allocator": detect_allocator(),
        "env": env,
    }

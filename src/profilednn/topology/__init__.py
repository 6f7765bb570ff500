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

The package's modules, one concern each: ``shape`` (``CpuTopology``), ``sysfs`` (the
detected CPU), ``dtype_policy`` (native and faster dtypes), ``isa_cap`` (oneDNN's cap),
``injection`` (an injected CPU) and ``recorded`` (a recorded one). This module chooses the
CPU every job sees (:func:`cpu_topology`) and exports every name from here; it looks
:func:`detected_topology` up at call time, so a test replaces it here
(``monkeypatch.setattr(profilednn.topology, "detected_topology", ...)``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace

from .dtype_policy import (BF16_MATRIX_FLAG, BF16_VECTOR_FLAG, DTYPE_ISA, FINGERPRINT_ISA_FLAGS, MATRIX_UNIT, MIN_GEMM_SPEEDUP,
                           NATIVE_BF16_FLAGS, REDUCED_DTYPES, DtypeSpeed, bf16_tier, dtype_speed, faster_dtypes,
                           has_native_bf16)
from .injection import (ENV_CPU_FLAGS, ENV_TOPOLOGY, load_topology, topology_from_dict, topology_injection,
                        with_cpu_flags)
from .isa_cap import ENV_ONEDNN_MAX_ISA, FLAG_ONEDNN_ISA, ONEDNN_ISA_MASKS, ONEDNN_NO_CAP, capped_isa, onednn_isa_cap
from .recorded import LSCPU_CACHES, topology_from_cpu_profile
from .shape import ISA_FLAGS, Cache, Core, CpuTopology
# SYS_CPU and SYS_NODE are read where they live: a test points them elsewhere in ``.sysfs``
from .sysfs import CACHE_KINDS, SYS_CPU, SYS_NODE, detected_topology, size_bytes


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


__all__ = ["Cache", "Core", "CpuTopology", "DTYPE_ISA", "DtypeSpeed", "ENV_CPU_FLAGS", "ENV_ONEDNN_MAX_ISA",
           "ENV_TOPOLOGY", "FLAG_ONEDNN_ISA", "ISA_FLAGS", "bf16_tier", "ONEDNN_ISA_MASKS", "capped_isa", "isa_cap_note",
           "isa_removed_by_cap", "onednn_isa_cap", "MATRIX_UNIT", "MIN_GEMM_SPEEDUP", "REDUCED_DTYPES", "cpu_topology",
           "detected_topology", "dtype_speed", "faster_dtypes", "load_topology", "size_bytes",
           "topology_from_cpu_profile", "topology_from_dict", "topology_injection", "with_cpu_flags",
           "CACHE_KINDS", "LSCPU_CACHES", "ONEDNN_NO_CAP", "SYS_CPU", "SYS_NODE", "BF16_MATRIX_FLAG", "BF16_VECTOR_FLAG",
           "FINGERPRINT_ISA_FLAGS", "NATIVE_BF16_FLAGS", "has_native_bf16"]

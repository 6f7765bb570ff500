"""A CPU injected in place of the detected one: a topology file (``PROFILEDNN_TOPOLOGY``)
and ISA flag edits (``PROFILEDNN_CPU_FLAGS``), read and applied (see the package doc)."""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import replace
from pathlib import Path

from ..errors import InputError
from .shape import Cache, Core, CpuTopology

ENV_TOPOLOGY = "PROFILEDNN_TOPOLOGY"  # a topology file that replaces the detected one
ENV_CPU_FLAGS = "PROFILEDNN_CPU_FLAGS"  # +flag/-flag edits of the ISA flags


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


__all__ = ["ENV_CPU_FLAGS", "ENV_TOPOLOGY", "load_topology", "topology_from_dict", "topology_injection",
           "with_cpu_flags"]

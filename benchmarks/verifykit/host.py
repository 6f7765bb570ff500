"""The machine ``verify`` measures: its CPU (from ``profilednn.topology``, so a CPU can be
injected with ``PROFILEDNN_TOPOLOGY``), its BF16 tier, its core count and its CUDA devices.

A test or a dry run can inject the whole host (``--host FILE``, a JSON object with any of
the fields below) to see which checks a 16-core machine with a GPU would run.
"""

from __future__ import annotations

import json
import platform
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from profilednn.errors import InputError
from profilednn.topology import bf16_tier, cpu_topology

TIERS = ("amx", "avx512_bf16", "none")  # what the CPU computes BF16 with
MANY_CORES = 8  # the ranks x threads and all-core rows need at least this many cores


@dataclass(frozen=True)
class Host:
    """What the checks are planned and judged against."""

    cpu: str
    cores: int
    tier: str
    cuda: tuple[str, ...] = ()
    torch: str = ""
    python: str = ""
    injected: bool = False

    @property
    def name(self) -> str:
        """The machine as every row names it."""
        gpu = f", {self.cuda[0]}" + (f" x{len(self.cuda)}" if len(self.cuda) > 1 else "") if self.cuda else ""
        return (f"{self.cpu}, {self.cores} cores, BF16 {self.tier}{gpu}; torch {self.torch}"
                + (" (injected host)" if self.injected else ""))

    def to_dict(self) -> dict:
        return {**asdict(self), "cuda": list(self.cuda), "name": self.name}


def detect_host() -> Host:
    """This machine, as the topology (injectable) and torch see it."""
    import torch


    topo = cpu_topology()  # injectable (PROFILEDNN_TOPOLOGY), oneDNN's ISA cap applied
    cuda = tuple(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())) \
        if torch.cuda.is_available() else ()
    return Host(cpu=topo.model_name, cores=topo.physical_cores, tier=bf16_tier(topo.isa), cuda=cuda,
                torch=torch.__version__, python=platform.python_version())


def load_host(path: str | Path, detected: Host) -> Host:
    """``detected`` with the fields a host file sets replaced (``cuda``: a list of names)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"--host {path}: cannot read a JSON host file ({exc})") from exc
    known = {f.name for f in fields(Host)} - {"injected"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise InputError(f"--host {path}: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    if "tier" in data and data["tier"] not in TIERS:
        raise InputError(f"--host {path}: tier must be one of {', '.join(TIERS)}, not {data['tier']!r}")
    if "cores" in data and (not isinstance(data["cores"], int) or data["cores"] < 1):
        raise InputError(f"--host {path}: cores must be a positive integer, not {data['cores']!r}")
    if "cuda" in data:
        data["cuda"] = tuple(data["cuda"])
    return replace(detected, **data, injected=True)


__all__ = ["MANY_CORES", "TIERS", "Host", "detect_host", "load_host"]

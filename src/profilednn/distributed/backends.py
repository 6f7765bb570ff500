"""Which torch.distributed backend the ranks use: gloo by default, MPI or oneCCL when present.

Detection only looks (``torch.distributed.is_*_available``, an importable oneCCL binding,
an ``mpirun`` on PATH); a backend asked for but missing falls back to gloo with a note
instead of failing deep inside ``init_process_group``.
"""

from __future__ import annotations

import importlib.util
import shutil
from dataclasses import dataclass

from ..errors import InputError

BACKENDS = ("auto", "gloo", "mpi", "ccl")
CCL_MODULES = ("oneccl_bindings_for_pytorch", "torch_ccl")
ENV_BACKEND = "PROFILEDNN_DIST_BACKEND"


@dataclass(frozen=True)
class BackendStatus:
    """One backend: whether it can be used here, and why not."""

    name: str
    available: bool
    detail: str


@dataclass(frozen=True)
class BackendChoice:
    name: str  # the backend init_process_group gets
    requested: str
    note: str | None = None


def backend_status() -> list[BackendStatus]:
    """gloo, mpi and ccl as this installation sees them."""
    import torch.distributed as dist

    out = [BackendStatus("gloo", bool(dist.is_available() and dist.is_gloo_available()),
                         "built into torch" if dist.is_gloo_available() else "torch built without gloo")]
    mpi_torch = bool(dist.is_available() and dist.is_mpi_available())
    mpirun = shutil.which("mpirun") or shutil.which("mpiexec")
    if mpi_torch and mpirun:
        out.append(BackendStatus("mpi", True, f"torch built with MPI; launcher {mpirun}"))
    else:
        why = [] if mpi_torch else ["torch was built without MPI"]
        if not mpirun:
            why.append("no mpirun/mpiexec on PATH")
        out.append(BackendStatus("mpi", False, "; ".join(why)))
    ccl = next((m for m in CCL_MODULES if importlib.util.find_spec(m) is not None), None)
    out.append(BackendStatus("ccl", ccl is not None,
                             f"oneCCL bindings: {ccl}" if ccl else
                             "oneCCL bindings for PyTorch (oneccl_bindings_for_pytorch) not installed"))
    return out


def choose_backend(requested: str = "auto", status: list[BackendStatus] | None = None) -> BackendChoice:
    """The backend to use for ``requested`` (auto -> gloo); missing ones fall back to gloo."""
    if requested not in BACKENDS:
        raise InputError(f"--backend must be one of {', '.join(BACKENDS)}, not {requested!r}")
    if requested in ("auto", "gloo"):
        return BackendChoice("gloo", requested)
    by_name = {s.name: s for s in (status if status is not None else backend_status())}
    wanted = by_name[requested]
    if wanted.available:
        return BackendChoice(requested, requested)
    return BackendChoice("gloo", requested, note=f"{requested} is not available ({wanted.detail}); using gloo")


__all__ = ["BACKENDS", "BackendChoice", "BackendStatus", "ENV_BACKEND", "backend_status", "choose_backend"]

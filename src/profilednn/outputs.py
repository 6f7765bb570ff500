"""Checks of output paths and thread counts made before any work starts.

A verb that would profile for a minute and then fail to write its report, or train at
one step a second because ``--threads 999`` oversubscribed two cores, should refuse at
once. These checks create nothing and import nothing heavy (no torch, no polars), so the
CLI runs them while parsing options.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import RunError


def _nearest_existing(path: Path) -> Path:
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_output_dir(path: Path | str) -> Path:
    """``path`` when it is, or can be created as, a directory this process writes into."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise RunError(f"cannot write into {p}: it is a file, not a directory")
    base = p if p.exists() else _nearest_existing(p.parent)
    if not base.is_dir():
        raise RunError(f"cannot create {p}: {base} is a file, not a directory")
    if not os.access(base, os.W_OK | os.X_OK):
        raise RunError(f"cannot write into {base}: permission denied or read-only")
    return p


def check_output_file(path: Path | str) -> Path:
    """``path`` when a file can be written there (its folder exists or can be made)."""
    p = Path(path)
    if p.is_dir():
        raise RunError(f"cannot write {p}: it is a directory")
    if p.exists() and not os.access(p, os.W_OK):
        raise RunError(f"cannot write {p}: permission denied or read-only")
    try:
        check_output_dir(p.parent)
    except RunError as exc:
        raise RunError(f"cannot write {p}: {exc}") from None
    return p


def usable_cpus() -> int:
    """Logical CPUs this process may run on (the injected topology's, in tests/what-ifs)."""
    from .topology import cpu_topology, topology_injection

    cpus = cpu_topology().logical_cpus
    if topology_injection() is None and hasattr(os, "sched_getaffinity"):
        cpus = min(cpus, len(os.sched_getaffinity(0))) or cpus
    return max(1, cpus)


def check_threads(threads: int | None, oversubscribe: bool = False) -> int | None:
    """``threads`` unless it is below 1, or above the usable CPUs without ``oversubscribe``."""
    if threads is None:
        return None
    if threads < 1:
        raise RunError(f"--threads must be >= 1, not {threads}")
    cpus = usable_cpus()
    if threads > cpus and not oversubscribe:
        raise RunError(
            f"--threads {threads} is more than the {cpus} CPU(s) this process may use; "
            "threads would queue for cores and every step time would be wrong "
            "(pass --oversubscribe to measure that anyway)"
        )
    return threads


def oversubscription_note(threads: int | None) -> str | None:
    """The note a Run carries when it ran more threads than CPUs, else None."""
    if threads is None:
        return None
    cpus = usable_cpus()
    if threads <= cpus:
        return None
    return (f"oversubscribed: {threads} intra-op threads on {cpus} CPU(s) (--oversubscribe); "
            "step times include threads waiting for cores")

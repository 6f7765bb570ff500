"""What a distributed launch is asked for: ``profilednn launch``'s options as one value.

``prepare_launch(command, LaunchSettings(nproc_per_node=2, ...))`` plans and checks the job;
the fields are the CLI's options (``--nproc-per-node``, ``--threads-per-rank``, ...), with
the same defaults. ``distributed/scale.py`` builds one per study point.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class LaunchSettings:
    """A launch's settings. ``threads_per_rank`` None: cores / ranks. ``master_addr`` None:
    loopback (one node only); ``master_port`` None: a free port on one node, else 29500.
    ``job_id`` None: a fresh name (one every node derives alike on several). With
    ``rank_logs`` each rank's output goes to ``<job dir>/logs/`` (``runs_dir`` overrides the
    runs directory, see ``job_dir_of``). ``allocator`` and ``membind`` are the
    run_cpu-style settings of :mod:`.rank_runtime`. Seconds: ``timeout`` (the watchdog's,
    whole job), ``rdzv_timeout`` (all nodes joining), ``pg_timeout`` (a collective)."""

    # the ranks of this node and their threads
    nproc_per_node: int
    threads_per_rank: int | None = None
    allow_span: bool = False
    # the nodes and their rendezvous
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    # the job: its backend, name and time limits
    backend: str = "auto"
    job_id: str | None = None
    max_restarts: int = 0
    timeout: float = 3600.0
    rdzv_timeout: float = 120.0
    pg_timeout: float = 300.0
    # where the ranks' output goes, and their runtime
    runs_dir: Path | None = None
    rank_logs: bool = True
    allocator: str = "auto"
    membind: bool = True


__all__ = ["LaunchSettings"]

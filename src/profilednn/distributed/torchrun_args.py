"""What the launcher is given: torchrun's arguments (or mpirun's command line) and the
environment every rank carries (the plan file, the backend, the job and its timeouts)."""

from __future__ import annotations

from pathlib import Path

from . import rank_entry
from .backends import ENV_BACKEND
from .preflight import is_loopback

ENV_JOB_ID = "PROFILEDNN_JOB_ID"
ENV_PG_TIMEOUT = "PROFILEDNN_PG_TIMEOUT"


def rank_entry_path() -> str:
    """The file every rank starts in (``rank_entry.py``), absolute."""
    return str(Path(rank_entry.__file__).resolve())


def torchrun_argv(entry: list[str], *, nnodes: int, nproc_per_node: int, endpoint: str, job: str,
                  node_rank: int, rdzv_timeout: float, max_restarts: int) -> list[str]:
    """torchrun's arguments: c10d rendezvous at ``endpoint``, node rank 0 hosting it."""
    rdzv_conf = f"is_host={'true' if node_rank == 0 else 'false'},join_timeout={int(rdzv_timeout)}"
    return [
        "--nnodes", str(nnodes),
        "--nproc-per-node", str(nproc_per_node),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", endpoint,
        "--rdzv-id", job,
        "--rdzv-conf", rdzv_conf,
        "--max-restarts", str(max_restarts),
        "--monitor-interval", "0.5",
        "--no-python",
        *entry,
    ]


def set_rank_env(env: dict[str, str], *, plan_file: Path, backend: str, job: str, pg_timeout: float,
                 node_rank: int, threads: int, max_restarts: int, addr: str) -> None:
    """What every rank's environment carries: the plan, the backend, the job and its timeouts."""
    env.update({
        rank_entry.PLAN_ENV: str(plan_file),
        ENV_BACKEND: backend,
        ENV_JOB_ID: job,
        ENV_PG_TIMEOUT: str(pg_timeout),
        "PROFILEDNN_NODE_RANK": str(node_rank),
        "PYTHONUNBUFFERED": "1",
        # torchrun would otherwise force 1 thread per rank (and warn); rank_entry sets the rest.
        "OMP_NUM_THREADS": str(threads),
    })
    if max_restarts > 0 and "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in env:
        # A restarted attempt would read the previous attempt's gloo addresses from the
        # agent's shared store ("connectFullMesh ... connection refused"): give each
        # attempt a fresh store, hosted by its rank 0.
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    # Without restarts the ranks use the agent's store, as under plain torchrun: a store
    # hosted in rank 0's process dies with rank 0, under ranks still tearing down, an
    # exit path plain torchrun never takes (see docs/distributed.md).
    if is_loopback(addr) and "GLOO_SOCKET_IFNAME" not in env:
        env["GLOO_SOCKET_IFNAME"] = "lo"


def mpirun_argv(entry: list[str], world_size: int) -> list[str]:
    """mpirun's command line: ``world_size`` ranks, unbound, with the rank environment exported."""
    return ["mpirun", "-np", str(world_size), "--bind-to", "none",
            "-x", rank_entry.PLAN_ENV, "-x", ENV_BACKEND, "-x", ENV_JOB_ID, "-x", ENV_PG_TIMEOUT, *entry]


__all__ = ["ENV_JOB_ID", "ENV_PG_TIMEOUT", "mpirun_argv", "rank_entry_path", "set_rank_env", "torchrun_argv"]

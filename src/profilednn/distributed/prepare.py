"""Plan and validate a launch before anything starts: the plan, the backend, the
rendezvous address, the plan file the ranks read, their environment and log directory,
and the launcher's command line (``PreparedLaunch``). Bad plans raise PlanError here."""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InputError
from ..topology import CpuTopology, cpu_topology
from .backends import BackendChoice, BackendStatus, choose_backend
from .launch_settings import LaunchSettings
from .plan import LaunchPlan, PlanError, make_plan
from .preflight import check_master, free_port, resolve_address
from .rank_runtime import RankRuntime, RuntimeProbe, probe_runtime, rank_runtime
from .torchrun_args import mpirun_argv, rank_entry_path, set_rank_env, torchrun_argv

DEFAULT_MASTER_PORT = 29500


@dataclass
class PreparedLaunch:
    """Everything decided before a job starts: the plan, the backend, the torchrun call."""

    plan: LaunchPlan
    backend: BackendChoice
    job_id: str
    master_addr: str
    master_port: int
    command: list[str]
    launcher_argv: list[str]  # torchrun's arguments (or mpirun's full command line)
    env: dict[str, str]
    plan_file: Path
    max_restarts: int
    timeout: float
    runtime: RankRuntime
    log_dir: Path | None = None  # per-rank log files (None: ranks write to the launcher's streams)
    notes: list[str] = field(default_factory=list)

    @property
    def launcher(self) -> str:
        return "mpirun" if self.backend.name == "mpi" else "torchrun"

    def discard(self) -> None:
        """Remove the temporary plan directory (after the job, or for ``--dry-run``)."""
        shutil.rmtree(self.plan_file.parent, ignore_errors=True)

    def torchrun_command(self) -> str:
        """The launcher command line, quoted for a POSIX shell (``shlex.join``): pasted into
        a shell it passes the same arguments and runs nothing else."""
        if self.launcher == "mpirun":
            return shlex.join(self.launcher_argv)
        return shlex.join(["torchrun", *self.launcher_argv])


RUNS_DIR_FLAGS = ("-o", "--output", "--runs-dir")


def job_dir_of(command: list[str], job_id: str, runs_dir: Path | None = None) -> Path:
    """The job directory the ranks' Runs go to: ``<runs>/<job>``.

    ``runs_dir`` wins; else a ``profilednn train`` command's own ``-o``/``--runs-dir``
    (and ``--job-id``) are read, so the logs land next to the Runs it writes; else ``runs``.
    """
    found_runs, found_job = None, None
    if "train" in command and any(Path(c).name.startswith("profilednn") for c in command[:command.index("train")]):
        args = command[command.index("train") + 1:]
        for i, arg in enumerate(args):
            name, eq, value = arg.partition("=")
            if not eq:
                value = args[i + 1] if i + 1 < len(args) else ""
            if name in RUNS_DIR_FLAGS and value:
                found_runs = value
            elif name == "--job-id" and value:
                found_job = value
    base = runs_dir if runs_dir is not None else Path(found_runs or "runs")
    return Path(base) / (found_job or job_id)


def _check_arguments(command: list[str], settings: LaunchSettings) -> None:
    if not command:
        raise InputError("give the command to run after `--`, e.g. `-- python train.py`")
    for name, value in (("--timeout", settings.timeout), ("--rdzv-timeout", settings.rdzv_timeout),
                        ("--pg-timeout", settings.pg_timeout)):
        if value <= 0:
            raise InputError(f"{name} must be > 0 seconds, not {value}")
    if settings.max_restarts < 0:
        raise InputError(f"--max-restarts must be >= 0, not {settings.max_restarts}")


def _master(master_addr: str | None, master_port: int | None, nnodes: int) -> tuple[str, int]:
    """The rendezvous address and port: given, or loopback and a free port on one node."""
    if nnodes > 1 and not master_addr:
        raise PlanError("--nnodes > 1 needs --master-addr (the address of node rank 0) and --master-port")
    addr = master_addr or "127.0.0.1"
    if master_port is not None:
        return addr, master_port
    return addr, DEFAULT_MASTER_PORT if nnodes > 1 else free_port(resolve_address(addr))


def _write_plan(plan_data: dict) -> Path:
    """The plan the ranks read, in a fresh temporary directory (removed again if the write fails)."""
    plan_dir = Path(tempfile.mkdtemp(prefix="profilednn-launch-"))
    plan_file = plan_dir / "plan.json"
    try:
        plan_file.write_text(json.dumps(plan_data, indent=2), encoding="utf-8")
    except OSError:
        shutil.rmtree(plan_dir, ignore_errors=True)
        raise
    return plan_file


def _log_dir(command: list[str], job: str, runs_dir: Path | None, nnodes: int, node_rank: int) -> Path:
    """The ranks' log directory: one per node, so nodes sharing a file system keep their own."""
    log_dir = (job_dir_of(command, job, runs_dir) / "logs").absolute()
    return log_dir / f"node{node_rank}" if nnodes > 1 else log_dir


def _job_id(settings: LaunchSettings, addr: str, port: int) -> str:
    """The job's name: given (``--job-id``, checked) or derived (see :func:`default_job_id`)."""
    job = settings.job_id or default_job_id(addr, port, settings.nnodes)
    if not job or any(not (c.isalnum() or c in "-_.") for c in job):
        raise InputError(f"--job-id may hold letters, digits, '-', '_' and '.', not {job!r}")
    return job


def prepare_launch(command: list[str], settings: LaunchSettings, *, topology: CpuTopology | None = None,
                   backends: list[BackendStatus] | None = None, probe: RuntimeProbe | None = None,
                   check: bool = True) -> PreparedLaunch:
    """Plan and validate a launch of ``command`` with ``settings``; nothing is started. Bad
    plans raise PlanError here.

    With ``settings.rank_logs`` each rank's stdout/stderr go to ``<job dir>/logs/`` (see
    :func:`job_dir_of`) and ``run_launch`` relays whole, tagged lines. ``topology``,
    ``backends`` and ``probe`` default to this machine's (tests pass others); ``check``
    False skips the rendezvous master's check (``--dry-run``).
    """
    s = settings
    _check_arguments(command, s)
    plan = make_plan(topology or cpu_topology(), s.nproc_per_node, s.threads_per_rank,
                     allow_span=s.allow_span, nnodes=s.nnodes, node_rank=s.node_rank)
    choice = choose_backend(s.backend, backends)
    notes = list(plan.notes)
    if choice.note:
        notes.append(choice.note)
    addr, port = _master(s.master_addr, s.master_port, s.nnodes)
    if check:
        check_master(addr, port, s.node_rank, connect_timeout=min(s.rdzv_timeout, s.timeout))
    job = _job_id(s, addr, port)

    env = dict(os.environ)
    if probe is None:
        probe = probe_runtime(env, numa_nodes=plan.numa_nodes)
    runtime = rank_runtime(plan, probe, env, allocator=s.allocator, membind=s.membind)
    notes += runtime.notes
    log_dir = _log_dir(command, job, s.runs_dir, s.nnodes, s.node_rank) if s.rank_logs else None

    plan_data = plan.to_dict() | {"env": list(runtime.env), "prefix": [list(p) for p in runtime.prefix],
                                  "log_dir": str(log_dir) if log_dir else None,
                                  "backend": choice.name, "job_id": job}
    plan_file = _write_plan(plan_data)
    set_rank_env(env, plan_file=plan_file, backend=choice.name, job=job, pg_timeout=s.pg_timeout,
                 node_rank=s.node_rank, threads=plan.threads_per_rank, max_restarts=s.max_restarts, addr=addr)
    entry = [sys.executable, rank_entry_path(), *command]
    if choice.name == "mpi":
        argv = mpirun_argv(entry, plan.world_size)
        notes.append("mpi: ranks are started by mpirun (torchrun cannot start MPI ranks); "
                     "--max-restarts does not apply")
    else:
        argv = torchrun_argv(entry, nnodes=s.nnodes, nproc_per_node=s.nproc_per_node, endpoint=f"{addr}:{port}",
                             job=job, node_rank=s.node_rank, rdzv_timeout=s.rdzv_timeout,
                             max_restarts=s.max_restarts)
    return PreparedLaunch(plan=plan, backend=choice, job_id=job, master_addr=addr, master_port=port,
                          command=list(command), launcher_argv=argv, env=env, plan_file=plan_file,
                          max_restarts=s.max_restarts, timeout=s.timeout, runtime=runtime, log_dir=log_dir,
                          notes=notes)


def default_job_id(addr: str, port: int, nnodes: int) -> str:
    """A fresh name on one node; on several, one every node derives alike (the rendezvous id)."""
    if nnodes > 1:
        safe = "".join(c if c.isalnum() else "-" for c in addr)
        return f"job-{safe}-{port}"
    return f"job-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"



__all__ = ["DEFAULT_MASTER_PORT", "PreparedLaunch", "RUNS_DIR_FLAGS", "default_job_id", "job_dir_of",
           "prepare_launch"]

"""Plan a job, check it can start, hand it to torchrun, and watch it to a bounded end.

Three time limits keep a distributed job from hanging: torchrun's rendezvous
``join_timeout`` (nodes that never arrive), the process-group timeout the trainer passes
to ``init_process_group`` (a collective that never completes, exported here as
``PROFILEDNN_PG_TIMEOUT``), and this module's watchdog, which ends the whole process
tree (agent and every rank) after ``timeout`` seconds whatever state it is in.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InputError, ProfileDNNError
from ..topology import CpuTopology, cpu_topology
from .backends import ENV_BACKEND, BackendChoice, BackendStatus, choose_backend
from .plan import LaunchPlan, PlanError, make_plan
from .rank_output import RankOutput
from .rank_runtime import RankRuntime, RuntimeProbe, probe_runtime, rank_runtime
from . import rank_entry

ENV_JOB_ID = "PROFILEDNN_JOB_ID"
ENV_PG_TIMEOUT = "PROFILEDNN_PG_TIMEOUT"
DEFAULT_MASTER_PORT = 29500
TEARDOWN_GRACE_S = 10.0


class JobFailed(ProfileDNNError):
    """The distributed job started but did not finish: a rank died, hung, or timed out."""

    def __init__(self, message: str, *, exit_code: int = 1, failures: list[dict] | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.failures = failures or []


# --------------------------------------------------------------------------- pre-flight
def free_port(addr: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``addr`` right now (bound to port 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return int(s.getsockname()[1])


def _resolve(addr: str) -> str:
    try:
        return socket.getaddrinfo(addr, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except socket.gaierror as exc:
        raise PlanError(f"master address {addr!r} does not resolve: {exc.strerror}") from exc


def is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(_resolve(addr)).is_loopback
    except PlanError:
        return False


def check_master(addr: str, port: int, node_rank: int, *, connect_timeout: float = 60.0) -> None:
    """Fail before anything starts when the rendezvous master cannot work.

    Node rank 0 hosts the rendezvous store, so ``addr:port`` must be bindable here (an
    address of this machine, a free port). Other nodes must reach it: they retry
    connecting for up to ``connect_timeout`` seconds, since node 0 may still be starting.
    """
    if not 0 < port < 65536:
        raise PlanError(f"--master-port must be in 1..65535, not {port}")
    ip = _resolve(addr)
    if node_rank == 0:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((ip, port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise PlanError(f"master port {port} is already in use on {addr}; pick another "
                                    "--master-port") from exc
                raise PlanError(f"node rank 0 hosts the rendezvous but cannot bind {addr}:{port} "
                                f"({exc.strerror}); --master-addr must be an address of this "
                                "machine") from exc
        return
    deadline = time.monotonic() + connect_timeout
    last: OSError | None = None
    while True:
        try:
            with socket.create_connection((ip, port), timeout=min(5.0, connect_timeout)):
                return
        except OSError as exc:
            last = exc
        if time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    raise PlanError(f"cannot reach the master {addr}:{port} from node rank {node_rank} within "
                    f"{connect_timeout:g} s ({getattr(last, 'strerror', None) or last}); start node "
                    "rank 0 first and check --master-addr/--master-port")


# --------------------------------------------------------------------------- the launch
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


def _rank_entry_path() -> str:
    return str(Path(rank_entry.__file__).resolve())


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


def _check_arguments(command: list[str], timeout: float, rdzv_timeout: float, pg_timeout: float,
                     max_restarts: int) -> None:
    if not command:
        raise InputError("give the command to run after `--`, e.g. `-- python train.py`")
    for name, value in (("--timeout", timeout), ("--rdzv-timeout", rdzv_timeout), ("--pg-timeout", pg_timeout)):
        if value <= 0:
            raise InputError(f"{name} must be > 0 seconds, not {value}")
    if max_restarts < 0:
        raise InputError(f"--max-restarts must be >= 0, not {max_restarts}")


def _master(master_addr: str | None, master_port: int | None, nnodes: int) -> tuple[str, int]:
    """The rendezvous address and port: given, or loopback and a free port on one node."""
    if nnodes > 1 and not master_addr:
        raise PlanError("--nnodes > 1 needs --master-addr (the address of node rank 0) and --master-port")
    addr = master_addr or "127.0.0.1"
    if master_port is not None:
        return addr, master_port
    return addr, DEFAULT_MASTER_PORT if nnodes > 1 else free_port(_resolve(addr))


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


def _torchrun_argv(entry: list[str], *, nnodes: int, nproc_per_node: int, endpoint: str, job: str,
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


def _set_rank_env(env: dict[str, str], *, plan_file: Path, backend: str, job: str, pg_timeout: float,
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


def _log_dir(command: list[str], job: str, runs_dir: Path | None, nnodes: int, node_rank: int) -> Path:
    """The ranks' log directory: one per node, so nodes sharing a file system keep their own."""
    log_dir = (job_dir_of(command, job, runs_dir) / "logs").absolute()
    return log_dir / f"node{node_rank}" if nnodes > 1 else log_dir


def prepare_launch(
    command: list[str],
    *,
    nproc_per_node: int,
    threads_per_rank: int | None = None,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str | None = None,
    master_port: int | None = None,
    allow_span: bool = False,
    backend: str = "auto",
    max_restarts: int = 0,
    timeout: float = 3600.0,
    rdzv_timeout: float = 120.0,
    pg_timeout: float = 300.0,
    job_id: str | None = None,
    runs_dir: Path | None = None,
    rank_logs: bool = True,
    allocator: str = "auto",
    membind: bool = True,
    topology: CpuTopology | None = None,
    backends: list[BackendStatus] | None = None,
    probe: RuntimeProbe | None = None,
    check: bool = True,
) -> PreparedLaunch:
    """Plan and validate a launch; nothing is started. Bad plans raise PlanError here.

    With ``rank_logs`` each rank's stdout/stderr go to ``<job dir>/logs/`` (see
    :func:`job_dir_of`; ``runs_dir`` overrides the runs directory) and :func:`run_launch`
    relays whole, tagged lines. ``allocator`` and ``membind`` are the run_cpu-style
    settings of :mod:`.rank_runtime`. ``topology``, ``backends`` and ``probe`` default to
    this machine's (tests pass others).
    """
    _check_arguments(command, timeout, rdzv_timeout, pg_timeout, max_restarts)
    plan = make_plan(topology or cpu_topology(), nproc_per_node, threads_per_rank,
                     allow_span=allow_span, nnodes=nnodes, node_rank=node_rank)
    choice = choose_backend(backend, backends)
    notes = list(plan.notes)
    if choice.note:
        notes.append(choice.note)
    addr, port = _master(master_addr, master_port, nnodes)
    if check:
        check_master(addr, port, node_rank, connect_timeout=min(rdzv_timeout, timeout))
    job = job_id or default_job_id(addr, port, nnodes)
    if not job or any(not (c.isalnum() or c in "-_.") for c in job):
        raise InputError(f"--job-id may hold letters, digits, '-', '_' and '.', not {job!r}")

    env = dict(os.environ)
    if probe is None:
        probe = probe_runtime(env, numa_nodes=plan.numa_nodes)
    runtime = rank_runtime(plan, probe, env, allocator=allocator, membind=membind)
    notes += runtime.notes
    log_dir = _log_dir(command, job, runs_dir, nnodes, node_rank) if rank_logs else None

    plan_data = plan.to_dict() | {"env": list(runtime.env), "prefix": [list(p) for p in runtime.prefix],
                                  "log_dir": str(log_dir) if log_dir else None,
                                  "backend": choice.name, "job_id": job}
    plan_file = _write_plan(plan_data)
    _set_rank_env(env, plan_file=plan_file, backend=choice.name, job=job, pg_timeout=pg_timeout,
                  node_rank=node_rank, threads=plan.threads_per_rank, max_restarts=max_restarts, addr=addr)
    entry = [sys.executable, _rank_entry_path(), *command]
    if choice.name == "mpi":
        argv = ["mpirun", "-np", str(plan.world_size), "--bind-to", "none",
                "-x", rank_entry.PLAN_ENV, "-x", ENV_BACKEND, "-x", ENV_JOB_ID, "-x", ENV_PG_TIMEOUT, *entry]
        notes.append("mpi: ranks are started by mpirun (torchrun cannot start MPI ranks); "
                     "--max-restarts does not apply")
    else:
        argv = _torchrun_argv(entry, nnodes=nnodes, nproc_per_node=nproc_per_node, endpoint=f"{addr}:{port}",
                              job=job, node_rank=node_rank, rdzv_timeout=rdzv_timeout, max_restarts=max_restarts)
    return PreparedLaunch(plan=plan, backend=choice, job_id=job, master_addr=addr, master_port=port,
                          command=list(command), launcher_argv=argv, env=env, plan_file=plan_file,
                          max_restarts=max_restarts, timeout=timeout, runtime=runtime, log_dir=log_dir,
                          notes=notes)


def default_job_id(addr: str, port: int, nnodes: int) -> str:
    """A fresh name on one node; on several, one every node derives alike (the rendezvous id)."""
    if nnodes > 1:
        safe = "".join(c if c.isalnum() else "-" for c in addr)
        return f"job-{safe}-{port}"
    return f"job-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


@dataclass(frozen=True)
class LaunchResult:
    job_id: str
    exit_code: int
    wall_s: float
    exits: tuple[dict, ...] = ()  # ranks of this node that ended through rank_entry's clean exit


def rank_exits(plan_dir: Path) -> tuple[dict, ...]:
    """How this node's ranks of the job's last attempt ended through rank_entry's clean exit
    (the records they wrote under ``<plan dir>/exits/``), by rank."""
    records = []
    for path in sorted((plan_dir / rank_entry.EXITS_DIR).glob("rank*.json")):
        try:
            records.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue  # a record cut short: that rank is simply not summarised
    last = max((r.get("attempt", 0) for r in records), default=0)
    return tuple(sorted((r for r in records if r.get("attempt", 0) == last), key=lambda r: r.get("rank", -1)))


def clean_exit_note(exits: tuple[dict, ...]) -> str | None:
    """One line saying which ranks ended through the clean exit (None when none did), and the
    native threads still running in them, which a normal interpreter exit tears down."""
    if not exits:
        return None
    note = (f"clean exit: {_ranks_phrase(exits)} ended when the script did (atexit run, output flushed, "
            "no native teardown: docs/distributed.md)")
    by_threads: dict[str, list[dict]] = {}
    for record in exits:
        threads = _threads_phrase(record.get("native_threads") or [])
        if threads:
            by_threads.setdefault(threads, []).append(record)
    left = "; ".join(f"{threads} in {_ranks_phrase(records)}" for threads, records in by_threads.items())
    return note + (f"; native threads left running: {left}" if left else "")


def _ranks_phrase(records: list[dict] | tuple[dict, ...]) -> str:
    ranks = ",".join(str(r.get("rank")) for r in records)
    return f"rank{'s' if len(records) > 1 else ''} {ranks}"


def _threads_phrase(names: list[str]) -> str:
    """``gloo_tcp_loop, 2 pt_gloo_runloop``: thread names with their counts."""
    return ", ".join(name if n == 1 else f"{n} {name}" for name, n in sorted(Counter(names).items()))


def _descendants(pid: int) -> list:
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _kill_tree(proc: subprocess.Popen, grace: float = TEARDOWN_GRACE_S) -> int:
    """SIGTERM the agent (torchrun then stops its ranks), SIGKILL whatever is left after ``grace``."""
    import psutil

    procs = _descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    procs += [p for p in _descendants(proc.pid) if p not in procs]
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    psutil.wait_procs(procs, timeout=grace)
    return len(procs)


# The torchrun agent stops the other ranks with these once one failed: never a root cause.
AGENT_SIGNALS = frozenset({"SIGTERM", "SIGINT", "SIGHUP"})
# A rank that exits with an error within this many seconds of a peer dying of a signal
# (gloo: "Connection reset by peer") failed because of it; since ranks end without native
# teardown (rank_entry), such an error exit can reach the agent before the peer's death.
ROOT_CAUSE_WINDOW_S = 2


def describe_failures(report: dict) -> str:
    """One line naming the failed rank that failed first (a rank that died of a signal
    before a peer's error exit in the same moment), then the others."""
    if report.get("kind") == "agent":
        return f"the torchrun agent failed: {report.get('error', 'unknown error')}"
    failures = list(report.get("failures") or [])
    if not failures:
        return "a rank failed (no details)"

    def how(f: dict) -> str:
        end = f"was killed by {f['signal']}" if f.get("signal") else f"exited with code {f['exitcode']}"
        return f"rank {f['rank']} (local rank {f['local_rank']}, pid {f['pid']}) {end}"

    first = next((f for f in failures if f.get("first")), failures[0])
    if not first.get("signal"):  # an error exit right after a peer died is its consequence
        died = [f for f in failures if f.get("signal") and f["signal"] not in AGENT_SIGNALS
                and abs(int(f.get("timestamp", 0)) - int(first.get("timestamp", 0))) <= ROOT_CAUSE_WINDOW_S]
        first = died[0] if died else first
    others = [how(f) for f in failures if f is not first]
    return how(first) + (f" (first failure; then {'; '.join(others)})" if others else "")


def run_launch(prepared: PreparedLaunch, *, log_file: Path | None = None, ranks: frozenset[int] | None = None,
               prefix: bool = True) -> LaunchResult:
    """Run the prepared job to its end; raise JobFailed naming the rank when it fails.

    The job runs in its own session; the watchdog ends it (agent and ranks) after
    ``prepared.timeout`` seconds, and so does Ctrl-C or SIGTERM here. The ranks' output
    arrives as whole lines tagged ``[rank<R>]: `` (``prefix``), for ``ranks`` only (all
    by default; the log files keep everything). ``log_file`` receives it, and torchrun's
    own output, instead of the terminal. The temporary plan directory is removed however
    the job ends.
    """
    from ..interrupts import signals_as_interrupts

    try:
        with signals_as_interrupts():  # SIGTERM/SIGHUP unwind like Ctrl-C: job stopped, plan dir removed
            return _run(prepared, log_file, ranks, prefix)
    finally:
        prepared.discard()


def _run(prepared: PreparedLaunch, log_file: Path | None, ranks: frozenset[int] | None,
         prefix: bool) -> LaunchResult:
    report_file = prepared.plan_file.parent / "agent-report.json"
    if prepared.launcher == "mpirun":
        argv = prepared.launcher_argv
    else:
        argv = [sys.executable, "-m", "profilednn.distributed.agent", "--report", str(report_file),
                "--", *prepared.launcher_argv]
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(open(log_file, "a", encoding="utf-8")) if log_file is not None else None
        if prepared.log_dir is not None:
            try:
                prepared.log_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise InputError(f"cannot create the ranks' log directory {prepared.log_dir}: "
                                 f"{exc.strerror or exc}") from exc
            stack.enter_context(RankOutput(prepared.log_dir, stdout=out or sys.stdout, stderr=out or sys.stderr,
                                           ranks=ranks, prefix=prefix))
        if out is not None:
            out.flush()
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, env=prepared.env, start_new_session=True, stdout=out,
                                stderr=subprocess.STDOUT if out is not None else None)
        return _watch(prepared, proc, report_file, t0)


def _watch(prepared: PreparedLaunch, proc: subprocess.Popen, report_file: Path, t0: float) -> LaunchResult:
    try:
        code = proc.wait(timeout=prepared.timeout)
    except subprocess.TimeoutExpired:
        killed = _kill_tree(proc)
        raise JobFailed(
            f"job {prepared.job_id} did not finish within --timeout {prepared.timeout:g} s "
            f"(a rank hung or the job is too long); stopped the launcher and {killed} processes",
            exit_code=124,
        ) from None
    except BaseException:
        _kill_tree(proc)
        raise
    wall = time.monotonic() - t0
    exits = rank_exits(prepared.plan_file.parent)
    if code == 0:
        return LaunchResult(prepared.job_id, 0, wall, exits)
    report: dict = {}
    if report_file.exists():
        try:
            report = json.loads(report_file.read_text(encoding="utf-8"))
        except ValueError as exc:
            report = {"kind": "agent", "error": f"unreadable agent report: {exc}"}
    detail = describe_failures(report) if report else f"{prepared.launcher} exited with code {code}"
    restarts = f" after {prepared.max_restarts} restarts" if prepared.max_restarts else ""
    note = clean_exit_note(exits)
    raise JobFailed(f"job {prepared.job_id} failed{restarts}: {detail}" + (f"; {note}" if note else ""),
                    exit_code=code, failures=list(report.get("failures") or []))


def launch(command: list[str], **kwargs) -> LaunchResult:
    """``prepare_launch`` then ``run_launch`` (``log_file`` takes the ranks' output)."""
    log_file = kwargs.pop("log_file", None)
    return run_launch(prepare_launch(command, **kwargs), log_file=log_file)


__all__ = [
    "JobFailed",
    "LaunchResult",
    "PreparedLaunch",
    "check_master",
    "clean_exit_note",
    "describe_failures",
    "free_port",
    "launch",
    "prepare_launch",
    "rank_exits",
    "run_launch",
]

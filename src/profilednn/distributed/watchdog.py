"""Run a prepared job to a bounded end: the launcher in its own session, the ranks' output
relayed, and a watchdog that ends the whole process tree (agent and every rank) after
``timeout`` seconds, on Ctrl-C or SIGTERM, whatever state it is in."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError, ProfileDNNError
from .job_outcome import clean_exit_note, describe_failures, rank_exits
from .prepare import PreparedLaunch
from .rank_output import RankOutput

TEARDOWN_GRACE_S = 10.0


class JobFailed(ProfileDNNError):
    """The distributed job started but did not finish: a rank died, hung, or timed out."""

    def __init__(self, message: str, *, exit_code: int = 1, failures: list[dict] | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.failures = failures or []



@dataclass(frozen=True)
class LaunchResult:
    job_id: str
    exit_code: int
    wall_s: float
    exits: tuple[dict, ...] = ()  # ranks of this node that ended through rank_entry's clean exit


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



__all__ = ["JobFailed", "LaunchResult", "TEARDOWN_GRACE_S", "run_launch"]

"""One child process of ``optimize``, started in a session of its own and ended with its whole group.

Both kinds of child-process arm run here: a user's script (``script/runner.py``) and a
built-in workload under a launch environment (``child_ab.py``, the child ``child.py``).
What each runs and how it reports back differ (a JSON result from the script's arm, a
``torch.save`` result from the built-in child); how the process is started and ended does
not: with ProfileDNN importable, as the leader of a new session, and when it ends, times
out or is interrupted, whatever is left of its process group is ended too, so nothing it
started outlives its arm or runs into the next one's timing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

GROUP_GRACE_S = 5.0
"""Seconds the arm's processes get to end after SIGTERM before SIGKILL (a timeout, Ctrl-C)."""


def package_root() -> str:
    """The folder that holds the ``profilednn`` package (put on the child's PYTHONPATH)."""
    return str(Path(__file__).resolve().parents[2])


def child_env(env: dict[str, str]) -> dict[str, str]:
    """This process's environment with ``env`` on top and ProfileDNN importable."""
    out = {**os.environ, **env}
    root = package_root()
    parts = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in parts:
        out["PYTHONPATH"] = os.pathsep.join([root, *parts])
    return out


def module_command(module: str, *args: str) -> list[str]:
    """``python -m module args...`` with this interpreter."""
    return [sys.executable, "-m", module, *args]


def run_in_own_group(argv: list[str], env: dict[str, str], timeout_s: float, *,
                     stdout: IO[str] | int | None = None, stderr: IO[str] | int | None = None) -> int:
    """Run ``argv`` in a session of its own to its end (its exit code); then end whatever is
    left of its process group: processes the child started and left running (a framework's
    own ranks, a server) must not outlive the arm or time the next one. A timeout
    (``subprocess.TimeoutExpired``) or an interrupt here ends the whole group first."""
    proc = subprocess.Popen(argv, env=env, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        return proc.wait(timeout=timeout_s)
    finally:
        end_group(proc)


def end_group(proc: subprocess.Popen, grace: float = GROUP_GRACE_S) -> None:
    """SIGTERM the process group of ``proc`` (its session leader) while the leader runs, SIGKILL
    what is left after ``grace``; an empty group is the usual case, not an error."""
    if proc.poll() is None:
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    _signal_group(proc.pid, signal.SIGKILL)
    proc.wait()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:  # nothing left in the group
        return


@dataclass(frozen=True)
class Finished:
    """A child that ran to its end: its exit code and what it wrote to stdout and stderr."""

    code: int
    stdout: str
    stderr: str

    def tail(self, lines: int = 3) -> str:
        """Its last ``lines`` lines of output (stderr's, else stdout's), joined by `` | ``: why it failed."""
        return " | ".join((self.stderr or self.stdout or "").strip().splitlines()[-lines:])


def run_captured(argv: list[str], env: dict[str, str], timeout_s: float) -> Finished:
    """``run_in_own_group`` with the child's stdout and stderr kept (in temporary files: a pipe
    nobody reads while the child runs could fill and stall it)."""
    with tempfile.TemporaryFile("w+", errors="replace") as out, tempfile.TemporaryFile("w+", errors="replace") as err:
        code = run_in_own_group(argv, env, timeout_s, stdout=out, stderr=err)
        out.seek(0)
        err.seek(0)
        return Finished(code, out.read(), err.read())


__all__ = ["Finished", "GROUP_GRACE_S", "child_env", "end_group", "module_command", "package_root", "run_captured",
           "run_in_own_group"]

"""Plan the checks against a time budget and run each in a child process.

A check the host cannot run gives ``n/a`` rows; one whose estimate (scaled by how much
slower than estimated the checks so far ran) no longer fits the time left gives
``skipped`` rows; one that crashes, or runs past the time left, gives ``error`` rows with
the reason. The budget is wall time, start-up of each child included.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from .catalogue import Check
from .host import Host
from .rows import Row

VERIFY = Path(__file__).resolve().parent.parent / "verify.py"
RESERVE_S = 3.0  # kept back for writing the results after the last check


@dataclass
class Outcome:
    rows: list[Row] = field(default_factory=list)
    skipped_for_time: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)


def child_command(check: Check, result: Path, quick: bool, host_file: str | None) -> list[str]:
    cmd = [sys.executable, str(VERIFY), "--child", check.run, "--result", str(result)]
    return cmd + (["--quick"] if quick else []) + (["--host", host_file] if host_file else [])


def _last_line(log_text: str) -> str:
    lines = [ln.strip() for ln in log_text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no output"


def run_child(check: Check, cmd: list[str], result: Path, timeout_s: float, log: IO[str]) -> list[Row]:
    """The check's rows from its child process, or error rows saying why there are none."""
    log.write(f"\n==> {check.name}: {' '.join(cmd)}\n")
    log.flush()
    start = log.tell()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        code = proc.wait(timeout=max(1.0, timeout_s))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return check.unmeasured("error", f"ran past the {timeout_s:.0f} s left of the budget; stopped")
    if code != 0 or not result.is_file():
        log.flush()
        with open(log.name) as fh:
            fh.seek(start)
            tail = _last_line(fh.read())
        return check.unmeasured("error", f"exit {code}: {tail}")
    return [Row.from_dict({**d, "check": check.name}) for d in json.loads(result.read_text())]  # the catalogue names it


def run_checks(host: Host, checks: Sequence[Check], budget_s: float, quick: bool, work: Path, log: IO[str],
               host_file: str | None = None, progress: Callable[[str], None] = print,
               clock: Callable[[], float] = time.monotonic) -> Outcome:
    """Every check in order: n/a, skipped for time, or run in a child (see module doc)."""
    out, t0 = Outcome(), clock()
    spent = estimated = 0.0
    for check in checks:
        reason = check.needs(host)
        if reason is not None:
            out.rows += check.unmeasured("n/a", reason)
            continue
        left = budget_s - (clock() - t0) - RESERVE_S
        pace = max(1.0, spent / estimated) if estimated else 1.0
        need = check.estimate(quick) * pace
        if need > left:
            out.rows += check.unmeasured("skipped", f"for time: needs ~{need:.0f} s, {max(0.0, left):.0f} s left "
                                                    f"(--budget-s)")
            out.skipped_for_time.append(check.name)
            progress(f"{check.name}: skipped for time (~{need:.0f} s needed, {max(0.0, left):.0f} s left)")
            continue
        progress(f"{check.name}: running (~{need:.0f} s; {left:.0f} s left)")
        result = work / f"{check.name}.json"
        started = clock()
        rows = run_child(check, child_command(check, result, quick, host_file), result, left, log)
        took = clock() - started
        out.seconds[check.name] = round(took, 1)
        spent, estimated = spent + took, estimated + check.estimate(quick)
        out.rows += rows
        progress(f"{check.name}: {took:.0f} s, " + ", ".join(f"{r.status}" for r in rows))
    return out


def child_main(run: str, result: Path, host: Host, quick: bool) -> int:
    """Inside the child: call ``run`` (``module:function``) and write its rows as JSON."""
    from importlib import import_module

    module, fn = run.split(":")
    rows = getattr(import_module(module), fn)(host, quick)
    result.write_text(json.dumps([r.to_dict() for r in rows], default=str))
    return 0


__all__ = ["Outcome", "child_main", "run_checks"]

"""The projection's second stage: replay the cases alone, in a worker process.

Every case runs at the projection's thread count, cold (the cache evicted as
``replay_cache.py`` decides); at another count than the Run's, the op cases run once more
at the Run's own, so the step model can calibrate native kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from ..errors import InputError
from ..run import Run
from ..tables import OPS
from ..topology import cpu_topology
from ..hardware.machine import MachineProfile, cached_machine
from .project_cases import ProjectionCases
from .replay import ProgressFn, ReplayResult, run_worker
from .replay_cache import ReplayCache, replay_cache, step_footprint_bytes


@dataclass
class Replays:
    """What the worker measured: every case (``result``), the op cases at the Run's own
    thread count (``at_captured``, for calibration) and what cold replays evicted."""

    result: ReplayResult
    at_captured: ReplayResult | None = None
    cold: ReplayCache | None = None
    measured: bool = True  # False: nothing replayed, ``result`` is empty


def run_threads(run: Run) -> int:
    """The thread count the Run was captured with (all cores here when not recorded)."""
    t = run.fingerprint.get("threads")
    return int(t) if t else cpu_topology().physical_cores


def replay_threads(run: Run, threads: int | None) -> tuple[int, int]:
    """The thread count to replay at (default: the Run's) and the Run's own; at most the
    cores of this machine."""
    cores = cpu_topology().physical_cores
    captured = run_threads(run)
    threads = int(threads or captured)
    if threads < 1:
        raise InputError(f"--threads must be >= 1, not {threads}")
    if threads > cores:
        raise InputError(f"cannot replay at {threads} threads on {cores} cores here; "
                         "use a what-if (--machine FILE) to project beyond this machine")
    return threads, captured


def no_replay(threads: int) -> Replays:
    """Nothing measured: every item then counts at its in-situ time."""
    return Replays(ReplayResult(cases={}, log=pl.DataFrame(), threads=threads), measured=False)


def replay_all(run: Run, cases: ProjectionCases, threads: int, captured: int, machine: MachineProfile,
               steps: int, *, calibrate: bool, progress: ProgressFn | None, budget_s: float) -> Replays:
    """Replay every case at ``threads``; with ``calibrate`` and another count than the
    Run's ``captured`` one, the op cases again at that count."""
    env = {k: str(v) for k, v in (run.fingerprint.get("env") or {}).items()
           if k.startswith(("OMP_", "KMP_", "GOMP_")) and k != "OMP_NUM_THREADS"}
    cold = replay_cache(cached_machine() or (machine if machine.source == "measured" else None),
                        cpu_topology(), threads,
                        step_footprint_bytes(run.table(OPS), steps) if run.has_table(OPS) else None)
    result = run_worker(cases.every_case, threads, progress=progress, budget_s=budget_s,
                        env=env, evict_bytes=cold.bytes)
    at_captured = None
    if calibrate and cases.op_cases and threads != captured <= cpu_topology().physical_cores:
        at_captured = run_worker(cases.op_cases, captured, budget_s=budget_s, env=env, evict_bytes=cold.bytes)
    return Replays(result, at_captured, cold)


__all__ = ["Replays", "no_replay", "replay_all", "replay_threads", "run_threads"]

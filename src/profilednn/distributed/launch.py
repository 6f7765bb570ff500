"""Plan a job, check it can start, hand it to torchrun, and watch it to a bounded end.

Three time limits keep a distributed job from hanging: torchrun's rendezvous
``join_timeout`` (nodes that never arrive), the process-group timeout the trainer passes
to ``init_process_group`` (a collective that never completes, exported here as
``PROFILEDNN_PG_TIMEOUT``), and this module's watchdog, which ends the whole process
tree (agent and every rank) after ``timeout`` seconds whatever state it is in.

The launch is split by concern, and this module is its public face (every name below is
importable from here): ``launch_settings`` (``LaunchSettings``, the CLI's options),
``preflight`` (a free port, the rendezvous master's check), ``prepare`` (``prepare_launch``:
plan, backend, plan file, rank environment, log directory), ``torchrun_args`` (the
launcher's arguments and the ranks' environment), ``watchdog`` (``run_launch``: the job run
to a bounded end) and ``job_outcome`` (which rank failed first, the clean exits).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from .job_outcome import clean_exit_note, describe_failures, rank_exits
from .launch_settings import LaunchSettings
from .preflight import check_master, free_port, is_loopback
from .prepare import DEFAULT_MASTER_PORT, RUNS_DIR_FLAGS, PreparedLaunch, default_job_id, job_dir_of, prepare_launch
from .torchrun_args import ENV_JOB_ID, ENV_PG_TIMEOUT
from .watchdog import TEARDOWN_GRACE_S, JobFailed, LaunchResult, run_launch


def launch(command: list[str], settings: LaunchSettings | None = None, *, log_file: Path | None = None,
           **options: Any) -> LaunchResult:
    """``prepare_launch`` then ``run_launch`` (``log_file`` takes the ranks' output).
    ``options``: ``LaunchSettings`` fields over ``settings`` (``launch(cmd, nproc_per_node=2)``
    works as before the settings type), and prepare_launch's ``topology``, ``backends``,
    ``probe``, ``check``."""
    fields = {f.name for f in dataclasses.fields(LaunchSettings)}
    given = {k: v for k, v in options.items() if k in fields}
    machine = {k: v for k, v in options.items() if k not in fields}
    settings = dataclasses.replace(settings, **given) if settings is not None else LaunchSettings(**given)
    return run_launch(prepare_launch(command, settings, **machine), log_file=log_file)


__all__ = [
    "DEFAULT_MASTER_PORT",
    "ENV_JOB_ID",
    "ENV_PG_TIMEOUT",
    "JobFailed",
    "LaunchResult",
    "LaunchSettings",
    "PreparedLaunch",
    "RUNS_DIR_FLAGS",
    "TEARDOWN_GRACE_S",
    "check_master",
    "clean_exit_note",
    "default_job_id",
    "describe_failures",
    "free_port",
    "is_loopback",
    "job_dir_of",
    "launch",
    "prepare_launch",
    "rank_exits",
    "run_launch",
]

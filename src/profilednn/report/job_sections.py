"""Report sections contributed by other jobs (projection, optimize, memory, distributed).

Each job that adds tables to a Run exposes ``report_sections(run) -> list[Section]`` in its
``report`` module; the Run's HTML report includes whatever those return (an empty list when
the Run has none of that job's tables). For the terminal, a job that writes Runs of its own
exposes ``print_run_sections(run, console, *, wide) -> bool`` in its ``terminal`` module
(what its verb printed, from the Run; False when the Run has none of its tables). Jobs are
imported lazily so that a report of a plain profile Run pulls in nothing it does not need.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from types import ModuleType
from typing import TYPE_CHECKING

from ..render.html import Section

if TYPE_CHECKING:
    from rich.console import Console

    from ..run import Run

JOB_REPORT_MODULES = (
    "profilednn.projection.report",
    "profilednn.optimization.report",
    "profilednn.memory.report",
    "profilednn.distributed.report",
)
JOB_TERMINAL_MODULES = (
    "profilednn.optimization.terminal",
    "profilednn.memory.terminal",
    "profilednn.distributed.terminal",
)


def _installed(names: tuple[str, ...]) -> Iterator[ModuleType]:
    """The job modules ``names`` that this build has (a missing job is skipped; a broken one raises)."""
    for name in names:
        try:
            yield importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):
                continue  # that job is not part of this build
            raise


def job_sections(run: "Run") -> list[Section]:
    """The sections every installed job contributes for ``run``, in job order."""
    sections: list[Section] = []
    for module in _installed(JOB_REPORT_MODULES):
        sections.extend(module.report_sections(run))
    return sections


def print_job_sections(run: "Run", console: "Console", *, wide: bool = False) -> bool:
    """Print what each installed job's printer shows for ``run``; whether any printed."""
    printed = False
    for module in _installed(JOB_TERMINAL_MODULES):
        printed = module.print_run_sections(run, console, wide=wide) or printed
    return printed


__all__ = ["JOB_REPORT_MODULES", "JOB_TERMINAL_MODULES", "job_sections", "print_job_sections"]

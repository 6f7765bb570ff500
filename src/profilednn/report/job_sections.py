"""Report sections contributed by other jobs (projection, optimize, memory, distributed).

Each job that adds tables to a Run exposes ``report_sections(run) -> list[Section]`` in its
``report`` module; the Run's HTML report includes whatever those return (an empty list when
the Run has none of that job's tables). Jobs are imported lazily so that a report of a
plain profile Run pulls in nothing it does not need.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .html import Section

if TYPE_CHECKING:
    from ..run import Run

JOB_REPORT_MODULES = (
    "profilednn.projection.report",
    "profilednn.optimization.report",
    "profilednn.memory.report",
    "profilednn.distributed.report",
)


def job_sections(run: "Run") -> list[Section]:
    """The sections every installed job contributes for ``run``, in job order."""
    sections: list[Section] = []
    for name in JOB_REPORT_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):
                continue  # that job is not part of this build
            raise
        sections.extend(module.report_sections(run))
    return sections


__all__ = ["JOB_REPORT_MODULES", "job_sections"]

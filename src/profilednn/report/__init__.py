"""Reports: the terminal summary, one self-contained HTML file with PNG charts beside
it, and a Chrome / Perfetto trace of a Run."""

from __future__ import annotations

from .compare_report import report_compare
from ..render.html import Section
from .listing import list_runs
from .run_report import report_run
from .terminal import print_compare_summary, print_run_summary
from .trace import build_trace, write_trace

__all__ = [
    "Section",
    "build_trace",
    "list_runs",
    "print_compare_summary",
    "print_run_summary",
    "report_compare",
    "report_run",
    "write_trace",
]

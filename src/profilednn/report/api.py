"""The report job's Python API: HTML reports, traces and the Run listing; what
``profilednn report`` / ``compare`` / ``runs`` write with, and what ``profilednn`` exports."""

from __future__ import annotations

from .compare_report import default_output as default_compare_path
from .compare_report import report_compare
from .listing import list_runs
from .run_report import check_reportable, report_run
from .run_report import default_output as default_report_path
from .trace import build_trace, has_timeline, write_trace

__all__ = ["build_trace", "check_reportable", "default_compare_path", "default_report_path", "has_timeline",
           "list_runs", "report_compare", "report_run", "write_trace"]

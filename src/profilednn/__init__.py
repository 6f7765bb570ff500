"""ProfileDNN: profile, project and optimize deep-learning training on CPUs.

The Python API is the facade every CLI verb calls; each job takes Runs and returns
tables (polars DataFrames) or writes Runs and reports.
"""

from __future__ import annotations

from .errors import InputError, NoPrimitivesError, ProfileDNNError, RunError, WorkloadError
from .run import Run, create_run, iter_runs, load_run
from .verbose import breakdown, read_log
from .analysis import Advice, Analysis, Comparison, advise, compare

__version__ = "0.1.0"

# Reports pull in matplotlib: loaded on first use (profilednn.report_run, ...).
_LAZY = {
    "report_run": "profilednn.report",
    "report_compare": "profilednn.report",
    "write_trace": "profilednn.report",
    "list_runs": "profilednn.report",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'profilednn' has no attribute {name!r}")


__all__ = [
    "__version__",
    "Advice",
    "Analysis",
    "Comparison",
    "InputError",
    "NoPrimitivesError",
    "ProfileDNNError",
    "Run",
    "RunError",
    "WorkloadError",
    "breakdown",
    "advise",
    "compare",
    "create_run",
    "iter_runs",
    "list_runs",
    "load_run",
    "read_log",
    "report_compare",
    "report_run",
    "write_trace",
]

"""ProfileDNN: profile, project and optimize deep-learning training on CPUs.

The Python API is the facade every CLI verb calls; each job takes Runs and returns
tables (polars DataFrames) or writes Runs and reports.
"""

from __future__ import annotations

from .errors import InputError, NoPrimitivesError, ProfileDNNError, RunError, WorkloadError
from .run import Run, create_run, iter_runs, load_run

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "InputError",
    "NoPrimitivesError",
    "ProfileDNNError",
    "Run",
    "RunError",
    "WorkloadError",
    "create_run",
    "iter_runs",
    "load_run",
]

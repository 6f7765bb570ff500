"""ProfileDNN: profile, project and optimize deep-learning training on CPUs.

The Python API is the facade every CLI verb calls; each job takes Runs and returns
tables (polars DataFrames) or writes Runs and reports.
"""

from __future__ import annotations

from ._lazy import lazy_getattr
from .errors import (
    InputError,
    MissingExtraError,
    NoPrimitivesError,
    ProfileDNNError,
    RunError,
    WorkloadError,
)

__version__ = "0.1.0"

# Every export is loaded on first use: `import profilednn` (and the CLI's start-up)
# pulls in none of polars, numpy, matplotlib or torch (profilednn.report_run, ...).
_LAZY = {
    "Run": "profilednn.run",
    "create_run": "profilednn.run",
    "iter_runs": "profilednn.run",
    "load_run": "profilednn.run",
    "breakdown": "profilednn.verbose",
    "read_log": "profilednn.verbose",
    "Advice": "profilednn.analysis",
    "Analysis": "profilednn.analysis",
    "Comparison": "profilednn.analysis",
    "advise": "profilednn.analysis",
    "compare": "profilednn.analysis",
    "report_run": "profilednn.report",
    "report_compare": "profilednn.report",
    "write_trace": "profilednn.report",
    "list_runs": "profilednn.report",
    "offload_activations": "profilednn.memory.offload",
    "memory_run": "profilednn.memory.runs",
    "memory_tradeoff": "profilednn.memory.tradeoff",
    "fit_batch_to_budget": "profilednn.memory.budget",
    "train_pipeline": "profilednn.memory.pipeline.runner",
    "launch": "profilednn.distributed",
    "make_plan": "profilednn.distributed",
    "train": "profilednn.distributed",
    "TrainConfig": "profilednn.distributed",
    "merge_job": "profilednn.distributed",
    "scale_sweep": "profilednn.distributed",
    "weak_scaling": "profilednn.distributed",
    "convergence_study": "profilednn.distributed",
    "project_nodes": "profilednn.distributed",
    "project": "profilednn.projection",
    "get_machine": "profilednn.projection",
    "optimize": "profilednn.optimize",
}


__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = [
    "__version__",
    "Advice",
    "Analysis",
    "Comparison",
    "InputError",
    "MissingExtraError",
    "NoPrimitivesError",
    "ProfileDNNError",
    "Run",
    "RunError",
    "TrainConfig",
    "WorkloadError",
    "breakdown",
    "advise",
    "compare",
    "convergence_study",
    "create_run",
    "iter_runs",
    "get_machine",
    "list_runs",
    "load_run",
    "fit_batch_to_budget",
    "memory_run",
    "memory_tradeoff",
    "offload_activations",
    "train_pipeline",
    "optimize",
    "project",
    "read_log",
    "report_compare",
    "report_run",
    "scale_sweep",
    "train",
    "weak_scaling",
    "launch",
    "make_plan",
    "merge_job",
    "project_nodes",
    "write_trace",
]

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

# Each job's exports come from its api.py (the functions its CLI verbs call).
# Every export is loaded on first use: `import profilednn` (and the CLI's start-up)
# pulls in none of polars, numpy, matplotlib or torch (profilednn.report_run, ...).
_LAZY = {
    "Run": "profilednn.run",
    "create_run": "profilednn.run",
    "iter_runs": "profilednn.run",
    "load_run": "profilednn.run",
    "profile": "profilednn.capture.api",
    "profile_builtin": "profilednn.capture.api",
    "profile_script": "profilednn.capture.api",
    "build_workload": "profilednn.workloads.api",
    "list_workloads": "profilednn.workloads.api",
    "breakdown": "profilednn.verbose.api",
    "read_log": "profilednn.verbose.api",
    "Advice": "profilednn.analysis.api",
    "Analysis": "profilednn.analysis.api",
    "Comparison": "profilednn.analysis.api",
    "advise": "profilednn.analysis.api",
    "compare": "profilednn.analysis.api",
    "report_run": "profilednn.report.api",
    "report_compare": "profilednn.report.api",
    "write_trace": "profilednn.report.api",
    "list_runs": "profilednn.report.api",
    "offload_activations": "profilednn.memory.api",
    "memory_run": "profilednn.memory.api",
    "memory_tradeoff": "profilednn.memory.api",
    "fit_batch_to_budget": "profilednn.memory.api",
    "train_pipeline": "profilednn.memory.api",
    "launch": "profilednn.distributed.api",
    "LaunchSettings": "profilednn.distributed.api",
    "make_plan": "profilednn.distributed.api",
    "train": "profilednn.distributed.api",
    "TrainConfig": "profilednn.distributed.api",
    "merge_job": "profilednn.distributed.api",
    "scale_sweep": "profilednn.distributed.api",
    "weak_scaling": "profilednn.distributed.api",
    "convergence_study": "profilednn.distributed.api",
    "project_nodes": "profilednn.distributed.api",
    "project": "profilednn.projection.api",
    "get_machine": "profilednn.projection.api",
    "optimize": "profilednn.optimization.api",
    "optimize_script": "profilednn.optimization.api",
    "apply_run": "profilednn.optimization.api",
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
    "build_workload",
    "advise",
    "compare",
    "convergence_study",
    "create_run",
    "iter_runs",
    "get_machine",
    "list_runs",
    "list_workloads",
    "load_run",
    "fit_batch_to_budget",
    "memory_run",
    "memory_tradeoff",
    "offload_activations",
    "train_pipeline",
    "optimize",
    "optimize_script",
    "apply_run",
    "profile",
    "profile_builtin",
    "profile_script",
    "project",
    "read_log",
    "report_compare",
    "report_run",
    "scale_sweep",
    "train",
    "weak_scaling",
    "launch",
    "LaunchSettings",
    "make_plan",
    "merge_job",
    "project_nodes",
    "write_trace",
]

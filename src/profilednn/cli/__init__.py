"""Command-line interface: ``profilednn VERB ...`` (also ``python -m profilednn``)."""

from __future__ import annotations

from .app import app, main, run_cli

# Each module registers its verbs on ``app`` when imported; one module per job.
from . import verbs_verbose  # noqa: F401,E402  parse, breakdown
from . import verbs_workloads  # noqa: F401,E402  models
from . import verbs_capture  # noqa: F401,E402  profile, demo
from . import verbs_analysis  # noqa: F401,E402  report, compare, runs
from . import verbs_projection  # noqa: F401,E402  machine, project
from . import verbs_optimize  # noqa: F401,E402  optimize, apply
from . import verbs_distributed  # noqa: F401,E402  launch, train, scale, convergence
from . import verbs_memory  # noqa: F401,E402  memory, pipeline

__all__ = ["app", "main", "run_cli"]

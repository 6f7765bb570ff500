"""The optimize job's Python API: what ``profilednn optimize`` calls and what ``profilednn``
exports (``profilednn.optimize`` is the function below, not this package: the package is
``profilednn.optimization`` so that its name never shadows the function).

    model, optimizer, loss_fn, report = profilednn.optimize(model, optimizer, loss_fn, (x, y))

``optimize`` / ``optimize_setup`` apply and measure the recipes (``engine.py`` has the
algorithm); ``optimize_workload`` does it for a built-in workload and writes a Run.
"""

from __future__ import annotations

from ..train_step import TrainStep
from .abtest import ABResult, Timing, interleaved
from .engine import (
    OptimizeReport,
    OptimizeResult,
    RecipeResult,
    Settings,
    optimize,
    optimize_setup,
    step_flops,
)
from .numerics import NumericsResult, Trajectory, compare_trajectories, record_trajectory
from .recipes import (
    BF16_TOLERANCE,
    FP32_TOLERANCE,
    RECIPES,
    Context,
    Recipe,
    Tolerance,
    list_recipes,
    load_recipes,
    register,
    select_recipes,
)
from .workload import optimize_workload

__all__ = [
    "ABResult",
    "BF16_TOLERANCE",
    "Context",
    "FP32_TOLERANCE",
    "NumericsResult",
    "OptimizeReport",
    "OptimizeResult",
    "RECIPES",
    "Recipe",
    "RecipeResult",
    "Settings",
    "Timing",
    "Tolerance",
    "TrainStep",
    "Trajectory",
    "compare_trajectories",
    "interleaved",
    "list_recipes",
    "load_recipes",
    "optimize",
    "optimize_setup",
    "optimize_workload",
    "record_trajectory",
    "register",
    "select_recipes",
    "step_flops",
]

"""The optimize job's Python API: what ``profilednn optimize`` calls and what ``profilednn``
exports (``profilednn.optimize`` is the function below, not this package: the package is
``profilednn.optimization`` so that its name never shadows the function).

    model, optimizer, loss_fn, report = profilednn.optimize(model, optimizer, loss_fn, (x, y))

``optimize`` / ``optimize_setup`` apply and measure the recipes (``engine.py`` has the
algorithm); ``optimize_workload`` does it for a built-in workload and writes a Run;
``optimize_script`` for the user's own script (``script/``), and ``apply_run`` trains that
script with what an optimize Run of it accepted.
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
from .script import ScriptSettings, accepted_plan, apply_run, optimize_script
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
    "ScriptSettings",
    "Settings",
    "Timing",
    "Tolerance",
    "TrainStep",
    "accepted_plan",
    "apply_run",
    "Trajectory",
    "compare_trajectories",
    "interleaved",
    "list_recipes",
    "load_recipes",
    "optimize",
    "optimize_script",
    "optimize_setup",
    "optimize_workload",
    "record_trajectory",
    "register",
    "select_recipes",
    "step_flops",
]

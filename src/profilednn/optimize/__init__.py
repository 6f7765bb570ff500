"""The optimize job: recipes applied one by one and each proven by measurement.

    import profilednn
    model, optimizer, loss_fn, report = profilednn.optimize(model, optimizer, loss_fn, (x, y))
    print(report.table())

Every recipe says when it applies, applies itself to a fresh copy of the setup, and is
kept only when an interleaved A/B of step time shows it faster and a seeded numerics
check shows it trains the same (``api.py``). Recipes: ``frozen_weight_grads``,
``frozen_batchnorm``, ``fused_loss``, ``fused_optimizer``, ``channels_last``,
``dtype_policy``, ``torch_compile``, ``dataloader_workers``, ``threads``, ``allocator``.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from .abtest import ABResult, Timing, interleaved
from .api import (
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
    load_recipes,
    register,
    select_recipes,
)
from .setup import TrainSetup, setup_from_workload
from .workload import optimize_workload


def list_recipes() -> list[Recipe]:
    """Every built-in recipe, in the order ``optimize`` tries them."""
    return list(load_recipes().values())


class _CallablePackage(types.ModuleType):
    """``profilednn.optimize`` is this package and the function at once: once the package
    is imported, Python binds the name ``profilednn.optimize`` to it, so calling it must
    still run ``optimize(model, optimizer, loss_fn, sample_batch, recipes=None, ...)``."""

    def __call__(self, *args: Any, **kwargs: Any) -> OptimizeResult:
        return optimize(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage


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
    "TrainSetup",
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
    "setup_from_workload",
    "step_flops",
]

"""The optimize job's Python API: what ``profilednn optimize`` calls and what ``profilednn``
exports (``profilednn.optimize`` is the function below, not this package: the package is
``profilednn.optimization`` so that its name never shadows the function).

    model, optimizer, loss_fn, report = profilednn.optimize(model, optimizer, loss_fn, (x, y))

``optimize`` / ``optimize_setup`` apply and measure the recipes (``engine.py`` has the
algorithm); ``optimize_workload`` does it for a built-in workload and writes a Run;
``optimize_script`` for the user's own script (``script/``), and ``apply_run`` trains that
script with what an optimize Run of it accepted.
Names load on first use: ``Settings`` is light (the CLI builds its options from it), the
rest imports torch.
"""

from __future__ import annotations

from .._lazy import lazy_getattr

_WHERE = {  # module: the names it contributes
    ".abtest": ("ABResult", "Timing", "interleaved"),
    ".engine": ("optimize", "optimize_setup"),
    ".results": ("OptimizeReport", "OptimizeResult", "RecipeResult"),
    ".flops": ("step_flops",),
    ".settings": ("Settings",),
    ".numerics": ("NumericsResult", "Trajectory", "compare_trajectories", "record_trajectory"),
    ".recipes": ("BF16_TOLERANCE", "FP32_TOLERANCE", "RECIPES", "Context", "Recipe", "Tolerance", "list_recipes",
                 "load_recipes", "register", "select_recipes"),
    "..train_step": ("TrainStep",),
    ".workload": ("optimize_workload",),
    ".script": ("ScriptSettings", "accepted_plan", "apply_run", "optimize_script"),
}
_API = {name: module for module, names in _WHERE.items() for name in names}
__getattr__ = lazy_getattr(__package__, _API)  # relative names resolve against this package

__all__ = sorted(_API)

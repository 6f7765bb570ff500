"""``optimize``: try each recipe, keep the ones that make the step faster without changing
the training, and say why for every one.

For each recipe in order:

1. ``check`` on the current best setup: does it apply? If not, the reason is recorded.
2. Build the candidate: a fresh clone of the caller's setup with the accepted recipes and
   this one applied (the caller's objects are never modified).
3. Numerics: the candidate's seeded loss trajectory and first-step gradients against the
   stock setup's (``numerics.py``), within the recipe's stated tolerance.
4. Speed: interleaved A/B of step time, current best vs candidate, in this process;
   process-level recipes (allocator, threads) in child processes started with and
   without their environment (``abtest.py``, ``child.py``).
5. Accept when numerics pass and the median step is at least ``min_speedup`` faster;
   accepted recipes compose: the next recipe is measured against them.

At the end the stock and the optimized setups are timed against each other once more,
interleaved, for the total speedup; model FLOPs per step (``FlopCounterMode`` over one
forward + backward) and the machine's measured GEMM peak give the model FLOP/s share.

``optimize_setup`` takes the reference arm (``reference.py``) and runs the one search
(``search.py``, shared with a user's script) over this process's arms (``in_process.py``:
each recipe tried by ``trial.py``, process-level ones in ``child_ab.py``; the ending in
``final.py``, ``flops.py`` and ``headroom.py``); the report's types are in ``results.py``
and the settings in ``settings.py``.
"""


from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch
from torch import nn

from ..errors import InputError, ProfileDNNError
from ..progress import Progress
from ..train_step import TrainStep
from .estimates import fill_gains
from .flops import precision_peaks
from .in_process import InProcessArms
from .partial import OnResults
from .recipes import Context, Recipe, select_recipes
from .reference import take_reference
from .results import OptimizeResult
from .search import run_search
from .settings import Settings
from .trial import Bench, build



def recipe_context(chosen: list[Recipe], settings: Settings) -> Context:
    """What the recipes may consult: the CPU, the caller's options, the GEMM peaks the
    chosen recipes' dtypes need to say whether they pay."""
    from ..topology import cpu_topology

    topo = cpu_topology()
    return Context(topo, dict(settings.options), precision_peaks(chosen, topo))


def optimize_setup(
    base: TrainStep,
    recipes: list[str | Recipe] | str | None = None,
    settings: Settings | None = None,
    progress: Progress | None = None,
    name: str | None = None,
    on_results: OnResults | None = None,
) -> OptimizeResult:
    """Try ``recipes`` (all built-in ones by default) on ``base``; see the module docstring.
    ``on_results`` hears the recipe results so far each time one is decided (``partial.py``:
    a stopped search keeps them)."""
    settings = settings or Settings()
    settings.check()
    if settings.threads is not None:  # every arm at these threads (the child processes inherit them)
        torch.set_num_threads(settings.threads)
    say = progress or (lambda message: None)
    chosen = select_recipes(recipes)
    ctx = recipe_context(chosen, settings)
    reference = take_reference(base, settings, say)
    bench = Bench(base, ctx, settings, reference.noise, reference.calibration, say,
                  {r.name: i for i, r in enumerate(chosen)})
    report, state = run_search(name or base.name or type(base.model).__name__, chosen,
                               InProcessArms(bench, reference), settings, on_results)
    fill_gains(report.recipes)  # measured gain of each timed recipe; estimates come from a profile's advice
    final_setup = build(base, state.accepted, ctx)
    final_setup.env = dict(state.env)
    return OptimizeResult(final_setup.model, final_setup.optimizer, final_setup.loss_fn, report, final_setup)


def optimize(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    sample_batch: tuple[Any, Any],
    recipes: list[str | Recipe] | str | None = None,
    *,
    batches: list[tuple[Any, Any]] | None = None,
    data_loader: Any = None,
    settings: Settings | None = None,
    progress: Progress | None = None,
    **setting_overrides: Any,
) -> OptimizeResult:
    """Optimize a training setup on this CPU, proving each change by measurement.

    ``model``, ``optimizer`` (over the model's parameters) and ``loss_fn(outputs,
    targets)`` are used as given and never modified; ``sample_batch`` is one
    ``(inputs, targets)`` pair the steps train on (``batches`` several, cycled;
    ``data_loader`` a DataLoader instead). ``recipes``: names (``"a,b"`` or a list) or
    ``Recipe`` instances; None tries every built-in recipe. Keyword overrides set
    ``Settings`` fields (``rounds=``, ``numerics_steps=``, ``min_speedup=`` ...).

    Returns an ``OptimizeResult``: ``model, optimizer, loss_fn, report = optimize(...)``;
    its ``setup.run()`` trains with the accepted input layout and autocast.
    """
    if not isinstance(model, nn.Module):
        raise ProfileDNNError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ProfileDNNError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    model_params = {id(p) for p in model.parameters()}
    foreign = [p for g in optimizer.param_groups for p in g["params"] if id(p) not in model_params]
    if foreign:
        raise ProfileDNNError(f"the optimizer holds {len(foreign)} tensors that are not parameters of the model")
    known = set(Settings.__dataclass_fields__)
    unknown = sorted(set(setting_overrides) - known)
    if unknown:
        raise InputError(f"optimize() does not take {', '.join(unknown)}; settings are: {', '.join(sorted(known))}")
    if settings is None:
        settings = Settings(**setting_overrides)
    elif setting_overrides:
        settings = Settings(**{**asdict(settings), **setting_overrides})
    base = TrainStep(model, optimizer, loss_fn, list(batches) if batches else [sample_batch],
                     data_loader=data_loader)
    return optimize_setup(base, recipes, settings, progress)


__all__ = ["optimize", "optimize_setup"]

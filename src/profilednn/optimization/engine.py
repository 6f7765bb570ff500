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

``optimize_setup`` runs these stages, one module each: the reference arm
(``reference.py``), the search with its second pass (``search.py``, each recipe tried by
``trial.py``; process-level ones in ``child_ab.py``), the final numerics and A/B
(``final.py``), FLOPs and peaks (``flops.py``) and the headroom (``headroom.py``); the
report's types are in ``results.py`` and the settings in ``settings.py``.
"""


from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch
from torch import nn

from ..errors import InputError, ProfileDNNError
from ..train_step import TrainStep
from .estimates import fill_gains
from .final import FinalAB, final_ab, final_numerics
from .flops import FlopCount, count_flops, precision_peaks
from .gate import Arm
from .headroom import Headroom, measure_headroom
from .numerics import NumericsResult
from .partial import OnResults
from .recipes import Context, Recipe, select_recipes
from .reference import Reference, take_reference
from .results import OptimizeReport, OptimizeResult
from .search import SearchState, search
from .settings import Settings
from .trial import Bench, build

Progress = Callable[[str], None]


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
    from ..topology import cpu_topology

    settings = settings or Settings()
    settings.check()
    say = progress or (lambda message: None)
    chosen = select_recipes(recipes)
    topo = cpu_topology()
    ctx = Context(topo, dict(settings.options), precision_peaks(chosen, topo))
    reference = take_reference(base, settings, say)
    bench = Bench(base, ctx, settings, reference.noise, reference.calibration, say,
                  {r.name: i for i, r in enumerate(chosen)})
    state = search(chosen, bench, Arm(reference.trajectory), on_results)
    fill_gains(state.results)  # measured gain of each timed recipe; estimates come from a profile's advice
    numerics = final_numerics(bench, state.accepted, reference)
    notes = [] if numerics is None or numerics.passed else [
        f"the accepted recipes together drift from stock: {numerics.detail}"]
    final_setup = build(base, state.accepted, ctx)
    final_setup.env = dict(state.env)
    timing = final_ab(bench, state)
    flops = count_flops(base, state.accepted, ctx, say) if settings.measure_flops else FlopCount()
    headroom, why = (None, None) if not settings.headroom else measure_headroom(  # below the peak, by op family
        state.current, settings.headroom_steps, flops.by_dtype_final, flops.peaks, say, state.env)
    notes += timing.notes + flops.notes + ([why] if why else []) + _env_note(state.env, timing.measured_in)
    report = _report(name or base.name or type(base.model).__name__, state, reference,
                     numerics, timing, flops, headroom, settings, notes)
    return OptimizeResult(final_setup.model, final_setup.optimizer, final_setup.loss_fn, report, final_setup)


def _env_note(env: dict[str, str], measured_in: str | None) -> list[str]:
    """How to start training with the process-level settings that won."""
    if not env:
        return []
    return ["process-level settings were measured in child processes; start training with "
            + " ".join(f"{k}={v}" for k, v in env.items())
            + (" (the total above includes them)" if measured_in and measured_in.startswith("child")
               else " (the total above does not include them)")]


def _report(workload: str, state: SearchState, reference: Reference, numerics: NumericsResult | None,
            timing: FinalAB, flops: FlopCount, headroom: Headroom | None, settings: Settings,
            notes: list[str]) -> OptimizeReport:
    noise = reference.noise
    return OptimizeReport(
        workload=workload,
        recipes=state.results,
        accepted=[r.name for r in state.accepted] + [r.recipe for r in state.results if r.accepted and r.env],
        environment=state.env,
        baseline=timing.baseline,
        final=timing.final,
        flops_per_step=flops.total,
        gemm_peak_gflops=None if flops.peaks is None else flops.peaks.get("fp32"),
        flops_by_dtype=flops.by_dtype,
        flops_by_dtype_final=flops.by_dtype_final,
        peak_gflops_by_dtype=flops.peaks or None,
        threads=torch.get_num_threads(),
        final_numerics=numerics,
        final_measured_in=timing.measured_in,
        rounding_noise=None if noise is None else {"loss_max_rel_diff": noise.loss_max_rel_diff,
                                                    "grad_rel_diff": noise.grad_rel_diff},
        settings={k: v for k, v in asdict(settings).items()},
        notes=notes,
        headroom=headroom,
    )


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

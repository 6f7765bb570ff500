"""``optimize_workload``: optimize a built-in workload and keep the outcome as a Run.

The Run holds ``optimize_recipes`` (one row per recipe: applies or why not, before and
after ms, speedup, numerics verdict and figures, accepted), ``optimize_samples`` (every
timed sample), ``optimize_headroom`` (the optimized step by op family, unless
``Settings.headroom`` is off), ``steps`` (the optimized setup's timed steps from the final
A/B) and the summary under ``manifest["optimize"]``; ``profilednn report RUN`` shows them.
The recipe tables are written after each recipe too, so a stopped run keeps what it measured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import torch

from ..errors import ProfileDNNError
from ..run import Run, create_run
from ..tables import OPTIMIZE_HEADROOM, OPTIMIZE_RECIPES, OPTIMIZE_SAMPLES, STEPS, steps_frame
from .estimates import fill_gains, profile_advice
from .engine import Progress, optimize_setup
from .partial import ResultLog
from .results import OptimizeResult
from .settings import Settings
from .recipes import Recipe


def _steps_table(result: OptimizeResult) -> pl.DataFrame:
    final = result.report.final
    times = list(final.samples_ms) if final is not None else []
    return steps_frame([{"step": i, "time_ms": ms} for i, ms in enumerate(times)])


def optimize_workload(
    name: str,
    runs_dir: Path | str = "runs",
    recipes: list[str | Recipe] | str | None = None,
    *,
    threads: int | None = None,
    settings: Settings | None = None,
    progress: Progress | None = None,
    command: list[str] | None = None,
    profile: Path | str | None = None,
    **build_args: Any,
) -> tuple[Run, OptimizeResult]:
    """Build workload ``name`` (``build_args`` as for ``build_workload``: batch_size,
    image_size, num_classes, channels_last, dtype, seed, model knobs), optimize it, and
    write a Run with the outcome. ``threads`` sets torch's intra-op threads first;
    ``profile``: a profile Run of the workload whose advice gives each recipe's estimated
    gain (``estimates.py``)."""
    from ..capture.fingerprint import fingerprint
    from ..outputs import oversubscription_note
    from ..workloads import build_workload

    if threads is not None:
        if threads < 1:
            raise ProfileDNNError(f"threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    settings = settings or Settings()
    settings.check()
    if "seed" in build_args:
        settings.seed = int(build_args["seed"])
    advice = profile_advice(profile) if profile is not None else None
    base = build_workload(name, **build_args)
    with create_run(runs_dir, label=f"optimize-{name}", command=command, workload=base.config,
                    fingerprint=fingerprint(), kind="optimize") as run:
        result = optimize_setup(base, recipes, settings, progress, name=name, on_results=ResultLog(run, recipes))
        report = result.report
        fill_gains(report.recipes, advice)
        run.write_table(OPTIMIZE_RECIPES, report.table())
        run.write_table(OPTIMIZE_SAMPLES, report.samples())
        if report.headroom is not None:
            run.write_table(OPTIMIZE_HEADROOM, report.headroom.table())
        steps = _steps_table(result)
        if steps.height:
            run.write_table(STEPS, steps)
        oversubscribed = oversubscription_note(threads)
        run.set_status("complete", optimize=report.to_dict(), steps=steps.height,
                       notes=[*report.notes, *([oversubscribed] if oversubscribed else [])])
    return run, result


__all__ = ["optimize_workload"]

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

import torch

from ..errors import ProfileDNNError
from ..progress import Progress
from ..run import Run, create_run
from .estimates import fill_gains, profile_advice
from .engine import optimize_setup
from .outcome import write_outcome
from .partial import ResultLog
from .results import OptimizeResult
from .settings import Settings
from .recipes import Recipe


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

    settings = settings or Settings()
    threads = settings.threads if threads is None else threads
    if threads is not None:
        if threads < 1:
            raise ProfileDNNError(f"threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    settings.check()
    if "seed" in build_args:
        settings.seed = int(build_args["seed"])
    advice = profile_advice(profile) if profile is not None else None
    base = build_workload(name, **build_args)
    with create_run(runs_dir, label=f"optimize-{name}", command=command, workload=base.config,
                    fingerprint=fingerprint(), kind="optimize") as run:
        result = optimize_setup(base, recipes, settings, progress, name=name, on_results=ResultLog(run, recipes))
        fill_gains(result.report.recipes, advice)
        oversubscribed = oversubscription_note(threads)
        write_outcome(run, result.report, notes=[*result.report.notes, *([oversubscribed] if oversubscribed else [])])
    return run, result


__all__ = ["optimize_workload"]

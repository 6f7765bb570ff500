"""Memory results as Run tables, in a new Run or added to a profiled one.

Tables (see docs/memory.md): ``memory_layers`` (per layer), ``memory_summary`` (quantity,
predicted, measured), ``memory_budget`` (the batch search), ``memory_tradeoff`` (none /
offload / checkpoint / both). The manifest gets a ``memory`` object with the totals.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..errors import InputError
from ..progress import Progress
from ..run import Run, create_run, load_run
from ..tables import MEMORY_BUDGET, MEMORY_LAYERS, MEMORY_SUMMARY, MEMORY_TRADEOFF
from ..workloads import get_spec
from .budget import BudgetResult, fit_batch_to_budget
from .footprint import Footprint, measure_footprint
from .tradeoff import memory_tradeoff
from .training import build_on_device



def workload_knobs(run: Run) -> tuple[str, dict[str, Any]]:
    """(workload name, knobs) that rebuild the built-in workload a Run profiled."""
    wl = run.workload
    if wl.get("kind") != "builtin" or not wl.get("name"):
        raise InputError(f"Run {run.path} was not made from a built-in workload (kind "
                         f"{wl.get('kind')!r}); give --model NAME instead")
    config = dict(wl.get("config") or {})
    spec = get_spec(str(wl["name"]))
    knobs = {k: config[k] for k in spec.knobs if k in config}
    for k in ("dtype", "channels_last", "seed"):
        if k in config:
            knobs[k] = config[k]
    return str(wl["name"]), knobs


def write_memory_tables(
    run: Run,
    footprint: Footprint,
    budget: BudgetResult | None = None,
    tradeoff: Any | None = None,
) -> None:
    """Add the memory tables to ``run`` and its totals to the manifest."""
    run.write_table(MEMORY_LAYERS, footprint.layers)
    run.write_table(MEMORY_SUMMARY, footprint.summary_table())
    memory: dict[str, Any] = {**footprint.summary, "notes": footprint.notes}
    if budget is not None:
        run.write_table(MEMORY_BUDGET, budget.attempts)
        memory["budget"] = {"budget_bytes": budget.budget_bytes, "fixed_bytes": budget.fixed_bytes,
                            "bytes_per_item": budget.bytes_per_item,
                            "predicted_batch": budget.predicted_batch,
                            "confirmed_batch": budget.confirmed_batch}
    if tradeoff is not None:
        run.write_table(MEMORY_TRADEOFF, tradeoff)
    run.update(memory=memory)


def memory_analysis(
    name: str,
    knobs: dict[str, Any],
    *,
    device: str = "cpu",
    budget_bytes: int | None = None,
    confirm: bool = True,
    tradeoff: bool = False,
    checkpoint_policy: str = "every:2",
    offload_min_bytes: int | None = None,
    progress: Progress | None = None,
) -> tuple[Footprint, BudgetResult | None, Any | None]:
    """Footprint, then the budget search and the trade-off table when asked."""
    if progress is not None:
        progress("footprint")
    footprint = measure_footprint(build_on_device(name, device=device, **knobs))
    budget = None
    if budget_bytes is not None:
        budget = fit_batch_to_budget(name, budget_bytes, device=device, confirm=confirm,
                                     progress=progress, **knobs)
    table = None
    if tradeoff:
        extra = {} if offload_min_bytes is None else {"offload_min_bytes": offload_min_bytes}
        table = memory_tradeoff(name, device=device, checkpoint_policy=checkpoint_policy,
                                progress=(lambda c: progress(f"trade-off: {c}")) if progress else None,
                                **extra, **knobs)
    return footprint, budget, table


def memory_run(
    name: str | None = None,
    runs_dir: Path | str = "runs",
    *,
    run_path: Path | str | None = None,
    command: list[str] | str | None = None,
    progress: Progress | None = None,
    threads: int | None = None,
    **options: Any,
) -> Run:
    """Measure workload ``name`` (or the one ``run_path`` profiled, adding the tables there)
    and write the results into a Run. ``options``: ``memory_analysis``'s keywords plus the
    workload knobs under ``knobs``; ``threads`` sets torch's intra-op threads first (more
    than the CPUs is noted in the Run)."""
    from ..capture.fingerprint import fingerprint
    from ..outputs import oversubscription_note

    if threads is not None:
        if threads < 1:
            raise InputError(f"threads must be >= 1, not {threads}")
        torch.set_num_threads(threads)
    oversubscribed = oversubscription_note(threads)

    knobs = dict(options.pop("knobs", {}) or {})
    if run_path is not None:  # tables added to a profiled Run: its status is not ours to set
        run = load_run(run_path)
        name, run_knobs = workload_knobs(run)
        knobs = {**run_knobs, **knobs}
        write_memory_tables(run, *memory_analysis(name, knobs, progress=progress, **options))
        return run
    if name is None:
        raise InputError("give --model NAME or a Run to add memory tables to")
    get_spec(name)
    with create_run(runs_dir, label=f"memory-{name}", command=command,
                    workload={"kind": "builtin", "name": name, "config": dict(knobs)},
                    fingerprint=fingerprint()) as run:
        write_memory_tables(run, *memory_analysis(name, knobs, progress=progress, **options))
        if oversubscribed:
            run.update(notes=[oversubscribed])
    return run


__all__ = ["memory_analysis", "memory_run", "workload_knobs", "write_memory_tables"]

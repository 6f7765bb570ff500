"""``dataloader_workers``: the DataLoader's worker count for CPU training (seed 000, 2.4).

On a GPU, workers keep the device fed; on a CPU they compete with the compute threads for
the same cores and add memory, so the best count is measured, not assumed: a loader with
no workers is tried with one (persistent) worker, a loader with workers is tried with
none. Only setups fed by a ``torch.utils.data.DataLoader`` have anything to tune.
"""

from __future__ import annotations

import inspect
from collections.abc import Collection
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from ..train_step import TrainStep
from .injection import Injection, ScriptProcess
from .recipe_contract import Context, Recipe
from .script_facts import ScriptFacts


def with_workers(loader: DataLoader, workers: int) -> DataLoader:
    """The same loader (dataset, batching, order, collation) with ``workers`` workers."""
    common: dict[str, Any] = dict(
        num_workers=workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        worker_init_fn=loader.worker_init_fn,
        persistent_workers=workers > 0,
        prefetch_factor=2 if workers > 0 else None,
        generator=loader.generator,
        timeout=loader.timeout,
    )
    if isinstance(loader.dataset, IterableDataset) or loader.batch_sampler is None:
        return DataLoader(loader.dataset, batch_size=loader.batch_size, drop_last=loader.drop_last, **common)
    return DataLoader(loader.dataset, batch_sampler=loader.batch_sampler, **common)


class DataLoaderWorkers(Recipe):
    name = "dataloader_workers"
    family = "data"
    summary = "DataLoader workers measured for CPU training: 0 <-> 1 persistent worker"
    changes_arithmetic = False

    def check(self, setup: TrainStep, ctx: Context) -> str | None:
        if setup.data_loader is None:
            return "no DataLoader: the batches come from an in-memory pool"
        if not isinstance(setup.data_loader, DataLoader):
            return f"the data comes from a {type(setup.data_loader).__name__}, not a torch DataLoader"
        return None

    def apply(self, setup: TrainStep, ctx: Context) -> str:
        before = setup.data_loader.num_workers
        after = 1 if before == 0 else 0
        setup.data_loader = with_workers(setup.data_loader, after)
        setup.rewind()
        return f"DataLoader num_workers {before} -> {after}" + (" (persistent)" if after else "")

    def script_check(self, facts: ScriptFacts, ctx: Context, accepted: Collection[str] = ()) -> str | None:
        if not facts.loader_workers:
            return "no torch DataLoader feeds the step"
        if all(w > 0 for w in facts.loader_workers):
            return f"the script's DataLoader already has workers ({', '.join(map(str, facts.loader_workers))})"
        return None

    def code_edit(self, facts: ScriptFacts) -> str | None:
        return "DataLoader(..., num_workers=1, persistent_workers=True)"

    def injection(self) -> Injection:
        return OneWorker()


class OneWorker(Injection):
    """Each DataLoader the script builds with ``num_workers=0`` gets one persistent worker."""

    def install(self, process: ScriptProcess) -> None:
        original = DataLoader.__init__
        signature = inspect.signature(original)

        def __init__(loader: DataLoader, *args: Any, **kwargs: Any) -> None:
            bound = signature.bind(loader, *args, **kwargs)
            if int(bound.arguments.get("num_workers", 0) or 0) == 0:
                bound.arguments["num_workers"] = 1
                bound.arguments["persistent_workers"] = True
                process.said(RECIPE.name, "DataLoader num_workers 0 -> 1 (persistent)")
            original(*bound.args, **bound.kwargs)

        process.patch(DataLoader, "__init__", __init__)


RECIPE = DataLoaderWorkers()

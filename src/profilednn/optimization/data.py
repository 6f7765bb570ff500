"""``dataloader_workers``: the DataLoader's worker count for CPU training (seed 000, 2.4).

On a GPU, workers keep the device fed; on a CPU they compete with the compute threads for
the same cores and add memory, so the best count is measured, not assumed: a loader with
no workers is tried with one (persistent) worker, a loader with workers is tried with
none. Only setups fed by a ``torch.utils.data.DataLoader`` have anything to tune.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from ..train_step import TrainStep
from .recipe_contract import Context, Recipe, register


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


@register
class DataLoaderWorkers(Recipe):
    name = "dataloader_workers"
    family = "data"
    summary = "DataLoader workers measured for CPU training: 0 <-> 1 persistent worker"
    advice_rules = ("data_loading",)
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

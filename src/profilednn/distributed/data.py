"""Deterministic global batches, cut into one slice per rank.

Step ``s`` always sees the same global batch, whatever the number of ranks and however
often the job restarted: rank ``r`` of ``W`` trains on rows ``[r*L, (r+1)*L)`` of it
(``L = global_batch / W``). So W ranks under DDP compute the same averaged gradient as
one process on the whole global batch, and a resumed job sees exactly the batches the
uninterrupted one would have.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..errors import WorkloadError


def shard(batch: Any, rank: int, world: int) -> Any:
    """Rows ``[rank*L, (rank+1)*L)`` of every tensor in ``batch`` (tensor, dict, list, tuple)."""
    if isinstance(batch, torch.Tensor):
        n = batch.shape[0]
        if n % world:
            raise WorkloadError(f"a global batch of {n} does not split evenly over {world} ranks")
        local = n // world
        return batch[rank * local:(rank + 1) * local].clone()
    if isinstance(batch, dict):
        return {k: shard(v, rank, world) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(shard(v, rank, world) for v in batch)
    return batch


@dataclass
class PoolBatches:
    """A built-in workload's synthetic pool of global batches; one epoch = one pass."""

    slices: list[tuple[Any, Any]]

    @classmethod
    def from_pool(cls, pool: list[tuple[Any, Any]], rank: int, world: int) -> "PoolBatches":
        return cls([(shard(x, rank, world), shard(y, rank, world)) for x, y in pool])

    @property
    def steps_per_epoch(self) -> int:
        return len(self.slices)

    def batch(self, step: int) -> tuple[Any, Any]:
        return self.slices[step % len(self.slices)]


@dataclass
class TensorDatasetBatches:
    """A real dataset (x, y), reshuffled each epoch with a seeded permutation; drop-last."""

    x: torch.Tensor
    y: torch.Tensor
    global_batch: int
    rank: int
    world: int
    seed: int = 0

    def __post_init__(self) -> None:
        if self.global_batch > len(self.y):
            raise WorkloadError(f"global batch {self.global_batch} is larger than the dataset "
                                f"({len(self.y)} samples)")
        if self.global_batch % self.world:
            raise WorkloadError(f"global batch {self.global_batch} does not split evenly over "
                                f"{self.world} ranks")
        self._epoch, self._perm = -1, torch.empty(0, dtype=torch.int64)

    @property
    def steps_per_epoch(self) -> int:
        return len(self.y) // self.global_batch

    def permutation(self, epoch: int) -> torch.Tensor:
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
            self._epoch, self._perm = epoch, torch.randperm(len(self.y), generator=g)
        return self._perm

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        epoch, within = divmod(step, self.steps_per_epoch)
        local = self.global_batch // self.world
        start = within * self.global_batch + self.rank * local
        idx = self.permutation(epoch)[start:start + local]
        return self.x[idx], self.y[idx]


__all__ = ["PoolBatches", "TensorDatasetBatches", "shard"]

"""DDP's data-parallel step done in one process, for the precision gate's digits task of a
recipe that changes the gradient allreduce (``ddp_bf16_allreduce``): each batch is split
into one equal shard per rank, each shard's gradients are computed as a rank computes them
(its own forward, loss and backward), and a ``Reduction`` turns the ranks' gradients of each
parameter into what every rank holds after the allreduce; then one optimizer step.

Every rank holds the same weights and the same reduced gradients, so one model stands for
all of them. The reduction acts element by element, as DDP's bucket hooks do on the
flattened bucket, so reducing parameter by parameter gives the same numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..train_step import TrainStep

Reduction = Callable[[list[torch.Tensor]], torch.Tensor]
"""The ranks' gradients of one parameter (rank order) -> what every rank holds after the allreduce."""


def fp32_average(grads: list[torch.Tensor]) -> torch.Tensor:
    """DDP's own allreduce (no hook): each rank's gradient divided by the ranks, then summed
    in fp32, rank after rank."""
    total = grads[0] / len(grads)
    for g in grads[1:]:
        total = total + g / len(grads)
    return total


class ShardedStep:
    """One data-parallel step over ``ranks`` simulated ranks, the gradients reduced by
    ``reduce``. A batch that does not split into equal shards loses its last samples (as
    ``DistributedSampler(drop_last=True)`` keeps the ranks' batches equal); one with fewer
    samples than ranks is skipped, in every arm alike."""

    def __init__(self, ranks: int, reduce: Reduction) -> None:
        if ranks < 2:
            raise ValueError(f"a data-parallel step needs at least 2 ranks, not {ranks}")
        self.ranks, self.reduce = ranks, reduce

    def shard_grads(self, setup: TrainStep, inputs: torch.Tensor, targets: torch.Tensor
                    ) -> list[list[torch.Tensor]] | None:
        """Each rank's gradients of every trainable parameter (rank order; None: too few samples)."""
        used = len(targets) // self.ranks * self.ranks
        if used == 0:
            return None
        params = [p for p in setup.model.parameters() if p.requires_grad]
        out = []
        for x, y in zip(inputs[:used].chunk(self.ranks), targets[:used].chunk(self.ranks)):
            setup.optimizer.zero_grad(set_to_none=True)
            setup.loss_fn(setup.forward(x), y).backward()
            out.append([torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in params])
        return out

    def __call__(self, setup: TrainStep) -> None:
        inputs, targets = setup.next_batch()
        per_rank = self.shard_grads(setup, inputs, targets)
        if per_rank is None:
            return
        params = [p for p in setup.model.parameters() if p.requires_grad]
        for i, p in enumerate(params):
            p.grad = self.reduce([grads[i] for grads in per_rank])
        setup.optimizer.step()


__all__ = ["Reduction", "ShardedStep", "fp32_average"]

"""Communication: a timed DDP allreduce hook, and the alpha-beta cost of an allreduce.

The hook does what DDP's default hook does (average the bucket across ranks) and notes
when each bucket's allreduce was handed to the backend and when it completed, so a step
can be split into compute and communication.

The alpha-beta model of a ring allreduce of ``m`` bytes over ``p`` ranks:
``T = 2 (p - 1) alpha + 2 (p - 1) / p * m * beta`` (alpha: per-message latency,
beta: seconds per byte, 1/bandwidth). ``measure_allreduce`` times real allreduces of
several sizes and ``fit_alpha_beta`` solves for alpha and beta by least squares.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import polars as pl
import torch
import torch.distributed as dist

from ..tables import DIST_COMM


@dataclass
class BucketTimer:
    """Allreduce intervals of the current step: (start, end) in ``perf_counter`` seconds."""

    world_size: int
    intervals: list[tuple[float, float]] = field(default_factory=list)
    starts: list[float] = field(default_factory=list)
    nbytes: int = 0

    def reset(self) -> None:
        self.intervals, self.starts, self.nbytes = [], [], 0

    @property
    def last_start(self) -> float | None:
        return max(self.starts) if self.starts else None

    def busy_s(self) -> float:
        """Wall time during which at least one bucket was being reduced."""
        total, end = 0.0, float("-inf")
        for a, b in sorted(self.intervals):
            if b <= end:
                continue
            total += b - max(a, end)
            end = b
        return total


def timed_allreduce_hook(timer: BucketTimer, bucket):  # noqa: ANN001, ANN201
    """DDP comm hook: average ``bucket`` (a dist.GradBucket) over the ranks, recording when it ran.

    Left unannotated on purpose: DDP checks the hook's annotations against the real
    classes, and this module's postponed (string) annotations would fail that check.
    """
    start = time.perf_counter()
    timer.starts.append(start)
    buffer = bucket.buffer()
    timer.nbytes += buffer.numel() * buffer.element_size()
    buffer.div_(timer.world_size)
    fut = dist.all_reduce(buffer, async_op=True).get_future()

    def done(f: torch.futures.Future) -> torch.Tensor:
        timer.intervals.append((start, time.perf_counter()))
        return f.value()[0]

    return fut.then(done)


def ring_allreduce_s(nbytes: float, ranks: int, alpha_s: float, beta_s_per_byte: float) -> float:
    """Alpha-beta time of a ring allreduce of ``nbytes`` over ``ranks`` ranks."""
    if ranks <= 1:
        return 0.0
    return 2 * (ranks - 1) * alpha_s + 2 * (ranks - 1) / ranks * nbytes * beta_s_per_byte


DEFAULT_SIZES = tuple(2 ** k for k in range(10, 23, 2))  # 1 KiB .. 4 MiB


def measure_allreduce(sizes: tuple[int, ...] = DEFAULT_SIZES, repeats: int = 5, warmup: int = 2) -> pl.DataFrame:
    """Median time of an fp32 allreduce per message size, over the current process group.

    Every rank must call this (it is collective); each rank returns the same sizes with
    its own timings.
    """
    rows = []
    world = dist.get_world_size()
    for nbytes in sizes:
        t = torch.ones(max(1, nbytes // 4), dtype=torch.float32)
        times = []
        for i in range(warmup + repeats):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            if i >= warmup:
                times.append(time.perf_counter() - t0)
        rows.append({"bytes": t.numel() * 4, "ranks": world, "median_s": statistics.median(times),
                     "min_s": min(times), "max_s": max(times), "repeats": repeats})
    return DIST_COMM.frame(rows)


@dataclass(frozen=True)
class AlphaBeta:
    """Allreduce cost model: latency per message and seconds per byte (ring algorithm)."""

    alpha_s: float
    beta_s_per_byte: float
    ranks: int
    source: str = "measured"

    @property
    def bandwidth_gbps(self) -> float:
        """Link bandwidth in GB/s (1e9 bytes per second)."""
        return 1.0 / self.beta_s_per_byte / 1e9 if self.beta_s_per_byte > 0 else float("inf")

    def allreduce_s(self, nbytes: float, ranks: int) -> float:
        return ring_allreduce_s(nbytes, ranks, self.alpha_s, self.beta_s_per_byte)

    def to_dict(self) -> dict:
        return {"alpha_s": self.alpha_s, "beta_s_per_byte": self.beta_s_per_byte, "ranks": self.ranks,
                "bandwidth_gbps": self.bandwidth_gbps, "source": self.source}


def fit_alpha_beta(table: pl.DataFrame) -> AlphaBeta:
    """Least-squares alpha and beta (both >= 0) from ``measure_allreduce``'s table."""
    ranks = int(table["ranks"][0])
    if ranks < 2:
        raise ValueError("an allreduce over one rank measures nothing; need >= 2 ranks")
    a = 2.0 * (ranks - 1)
    b = 2.0 * (ranks - 1) / ranks
    x = torch.tensor([[a, b * float(n)] for n in table["bytes"]], dtype=torch.float64)
    y = torch.tensor(table["median_s"].to_list(), dtype=torch.float64)
    # Scale the byte column so both unknowns are of similar size before solving.
    scale = float(x[:, 1].abs().max()) or 1.0
    xs = x.clone()
    xs[:, 1] /= scale
    sol = torch.linalg.lstsq(xs, y.unsqueeze(1)).solution.squeeze(1)
    alpha, beta = float(sol[0]), float(sol[1]) / scale
    if alpha < 0:  # latency below resolution: fit bandwidth alone
        alpha = 0.0
        beta = float((x[:, 1] * y).sum() / (x[:, 1] ** 2).sum())
    if beta < 0:  # sizes too small to see bandwidth: fit latency alone
        beta = 0.0
        alpha = float(y.mean()) / a
    return AlphaBeta(alpha_s=alpha, beta_s_per_byte=beta, ranks=ranks)


__all__ = [
    "AlphaBeta",
    "BucketTimer",
    "DEFAULT_SIZES",
    "fit_alpha_beta",
    "measure_allreduce",
    "ring_allreduce_s",
    "timed_allreduce_hook",
]

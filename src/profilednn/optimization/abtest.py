"""Interleaved A/B timing of two training setups in one process (or in child processes).

Rounds alternate the order (A B, B A, A B, ...) so that drift (other load, thermal,
frequency) hits both arms alike; each sample is the wall time of ``steps_per_sample``
steps divided by their number. The figures are medians with their spread; the speedup is
median(A) / median(B).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Timing:
    """Step-time samples of one arm (ms) and their summary."""

    samples_ms: tuple[float, ...]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms)

    @property
    def min_ms(self) -> float:
        return min(self.samples_ms)

    @property
    def max_ms(self) -> float:
        return max(self.samples_ms)

    def spread(self) -> str:
        return f"{self.min_ms:.1f}-{self.max_ms:.1f} ms"


@dataclass(frozen=True)
class ABResult:
    before: Timing
    after: Timing
    b_wins: float  # fraction of rounds in which B was faster than A

    @property
    def speedup(self) -> float:
        return self.before.median_ms / self.after.median_ms if self.after.median_ms > 0 else float("inf")


def interleaved(
    step_a: Callable[[], object],
    step_b: Callable[[], object],
    rounds: int,
    warmup: int = 1,
    steps_per_sample: int = 1,
    on_round: Callable[[int], None] | None = None,
) -> ABResult:
    """Time ``step_a`` against ``step_b``: ``warmup`` untimed steps each, then ``rounds``
    rounds of one sample each, in alternating order."""
    if rounds < 1 or steps_per_sample < 1:
        raise ValueError("rounds and steps_per_sample must be >= 1")
    for _ in range(warmup):
        step_a()
        step_b()
    a_ms: list[float] = []
    b_ms: list[float] = []

    def sample(step: Callable[[], object]) -> float:
        t0 = time.perf_counter()
        for _ in range(steps_per_sample):
            step()
        return (time.perf_counter() - t0) * 1000.0 / steps_per_sample

    for r in range(rounds):
        if r % 2 == 0:
            a_ms.append(sample(step_a))
            b_ms.append(sample(step_b))
        else:
            b_ms.append(sample(step_b))
            a_ms.append(sample(step_a))
        if on_round:
            on_round(r + 1)
    wins = sum(b < a for a, b in zip(a_ms, b_ms)) / rounds
    return ABResult(Timing(tuple(a_ms)), Timing(tuple(b_ms)), wins)


def from_samples(a_ms: list[float], b_ms: list[float], a_medians: list[float], b_medians: list[float]) -> ABResult:
    """An ABResult from samples gathered elsewhere (child processes): ``*_medians`` are
    the per-process medians, paired in the order the processes ran, for the win count."""
    pairs = list(zip(a_medians, b_medians))
    wins = sum(b < a for a, b in pairs) / len(pairs) if pairs else 0.0
    return ABResult(Timing(tuple(a_ms)), Timing(tuple(b_ms)), wins)


__all__ = ["ABResult", "Timing", "from_samples", "interleaved"]

"""Interleaved A/B timing of two training setups in one process (or in child processes).

Rounds alternate the order (A B, B A, A B, ...) so that drift (other load, thermal,
frequency) hits both arms alike; each sample is the wall time of ``steps_per_sample``
steps divided by their number. How many rounds run is the sequential test's call
(``sequential.py``): the speedup is the geometric mean of the paired rounds' ratios (moved
where B scatters more, ``step_scatter.py``), with
its interval; each arm's median and spread are reported beside it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .sequential import Interval, SequentialTest, fixed, interval, paired_rounds


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
    """Both arms' samples, the paired rounds (A ms, B ms) and the interval the test reached."""

    before: Timing
    after: Timing
    b_wins: float  # fraction of rounds in which B was faster than A
    pairs: tuple[tuple[float, float], ...] = ()
    interval: Interval | None = None

    @property
    def speedup(self) -> float:
        """The interval's point (geometric mean of the paired ratios, or moved); the ratio of medians
        where no interval could be formed."""
        if self.interval is not None:
            return self.interval.point
        return self.before.median_ms / self.after.median_ms if self.after.median_ms > 0 else float("inf")


def interleaved(
    step_a: Callable[[], object],
    step_b: Callable[[], object],
    rounds: int,
    warmup: int = 1,
    steps_per_sample: int = 1,
    on_round: Callable[[int, Interval | None], None] | None = None,
    test: SequentialTest | None = None,
) -> ABResult:
    """Time ``step_a`` against ``step_b``: ``warmup`` untimed steps each, then rounds of one
    sample each in alternating order, until ``test`` decides (default: exactly ``rounds``)."""
    if rounds < 1 or steps_per_sample < 1:
        raise ValueError("rounds and steps_per_sample must be >= 1")
    for _ in range(warmup):
        step_a()
        step_b()

    def sampler(step: Callable[[], object]) -> Callable[[int], float]:
        def sample(_round: int) -> float:
            t0 = time.perf_counter()
            for _ in range(steps_per_sample):
                step()
            return (time.perf_counter() - t0) * 1000.0 / steps_per_sample
        return sample

    test = test or fixed(rounds)
    pairs = paired_rounds(sampler(step_a), sampler(step_b), test, on_round)
    return from_pairs(pairs, test)


def from_pairs(pairs: list[tuple[float, float]], test: SequentialTest | None = None,
               a_ms: list[float] | None = None, b_ms: list[float] | None = None) -> ABResult:
    """An ABResult from paired rounds: each arm's samples are its rounds' (or ``a_ms`` and
    ``b_ms``, every step of child processes whose medians are the rounds), the interval
    judged with ``test``'s noise."""
    wins = sum(b < a for a, b in pairs) / len(pairs) if pairs else 0.0
    found = test.interval(pairs) if test is not None else interval(pairs)
    return ABResult(Timing(tuple(a_ms or [a for a, _ in pairs])), Timing(tuple(b_ms or [b for _, b in pairs])),
                    wins, tuple(pairs), found)


def in_children(rounds: int) -> str:
    """Where a child-process A/B of ``rounds`` rounds ran (a recipe's ``measured_in``)."""
    return f"child processes ({rounds} per arm, one per arm a round, order alternating)"


RunOutput = tuple[Sequence[float], Sequence[int], Any]  # a run's step times (ms), page faults per step, output


@dataclass
class ProcessRounds:
    """Paired rounds of whole runs (child processes): the A/B over each run's median step,
    every step's time in the arms' samples, each arm's page faults per step over all its
    runs, and each arm's first output (its seeded trajectory)."""

    ab: ABResult
    first_a: Any
    first_b: Any
    faults_a: list[int] = field(default_factory=list)
    faults_b: list[int] = field(default_factory=list)


def process_rounds(run_a: Callable[[int], RunOutput], run_b: Callable[[int], RunOutput], test: SequentialTest,
                   on_round: Callable[[int, Interval | None], None] | None = None) -> ProcessRounds:
    """Rounds of one run per arm (``run_x(round)``), until ``test`` decides: each round's
    sample is its run's median step."""
    steps: dict[str, list[float]] = {"a": [], "b": []}
    faults: dict[str, list[int]] = {"a": [], "b": []}
    first: dict[str, Any] = {}

    def sampler(key: str, run: Callable[[int], RunOutput]) -> Callable[[int], float]:
        def sample(r: int) -> float:
            times, faulted, out = run(r)
            test.steps.add(key, times)
            steps[key] += list(times)
            faults[key] += list(faulted)
            first.setdefault(key, out)
            return statistics.median(times)
        return sample

    pairs = paired_rounds(sampler("a", run_a), sampler("b", run_b), test, on_round)
    return ProcessRounds(from_pairs(pairs, test, steps["a"], steps["b"]), first["a"], first["b"], faults["a"],
                         faults["b"])


__all__ = ["ABResult", "ProcessRounds", "Timing", "from_pairs", "in_children", "interleaved", "process_rounds"]

"""Compute vs communication of a data-parallel script's steps, read from ``torch.profiler`` events.

Under DDP a step's backward hands each gradient bucket to the backend as soon as it is
ready (``c10d::allreduce_`` on the training thread) and the backend reduces it on threads
of its own (``gloo:all_reduce``); before the optimizer step the training thread waits for
the last bucket. Per step, then:

- **allreduce**: the wall time during which at least one collective ran on a backend thread
  (the union of their intervals), whether or not backward hid it;
- **exposed**: from the end of the step's last backward op on the training thread to the end
  of its last collective: the time the training thread could do nothing but wait.

A step is the span that ends with the training thread's ``Optimizer.step#...`` region
(steps are cut at those regions' ends). A script that reduces its gradients by hand after
backward (``dist.all_reduce(p.grad)``) gets the same split: its collectives follow the
backward ops, so all of them are exposed. The profiler slows the steps it records, so the
split also gives the profiled steps' own length: a caller applies the shares, not the
milliseconds, to steps timed without it. Plain data in, plain data out: no PyTorch here
but the conversion of a profiler's events (``spans_of``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

OPTIMIZER_STEP_PREFIX = "Optimizer.step#"
BACKWARD_PREFIX = "autograd::engine::evaluate_function"
COLLECTIVE_WORDS = ("all_reduce", "allreduce", "reduce_scatter", "all_gather", "allgather", "broadcast")
LAUNCH_PREFIX = "c10d::"  # the training thread's call into the process group, not the reduction


@dataclass(frozen=True)
class Span:
    """One profiler event: its name, thread and interval (microseconds, one clock)."""

    name: str
    thread: int
    start_us: float
    end_us: float


@dataclass(frozen=True)
class CommSplit:
    """The median over the profiled steps of each step's collective time and exposed part."""

    steps: int
    allreduce_ms: float
    exposed_ms: float
    collectives: float  # backend collectives per step (median)
    step_ms: float  # the profiled steps' own median length (the profiler slows them)

    def to_dict(self) -> dict[str, float | int]:
        return {"steps": self.steps, "allreduce_ms": self.allreduce_ms, "exposed_ms": self.exposed_ms,
                "collectives": self.collectives, "step_ms": self.step_ms}


def is_collective(span: Span, training_thread: int) -> bool:
    """A backend's collective: a reduce/gather/broadcast event off the training thread."""
    name = span.name.lower()
    return (span.thread != training_thread and not span.name.startswith(LAUNCH_PREFIX)
            and any(word in name for word in COLLECTIVE_WORDS))


def union_us(intervals: Iterable[tuple[float, float]]) -> float:
    """Wall time during which at least one interval was open."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def step_bounds(spans: Sequence[Span]) -> tuple[int, list[tuple[float, float]]] | None:
    """The training thread (the one that ran the optimizer steps) and each step's
    (start, end): from the previous optimizer step's end (the first: the earliest event)."""
    optimizer = sorted((s for s in spans if s.name.startswith(OPTIMIZER_STEP_PREFIX)), key=lambda s: s.start_us)
    if not optimizer:
        return None
    thread = optimizer[0].thread
    optimizer = [s for s in optimizer if s.thread == thread]
    starts = [min(s.start_us for s in spans), *(s.end_us for s in optimizer[:-1])]
    return thread, [(a, s.end_us) for a, s in zip(starts, optimizer)]


def one_step(spans: Sequence[Span], thread: int, start: float, end: float) -> tuple[float, float, int]:
    """(allreduce us, exposed us, collectives) of the step between ``start`` and ``end``."""
    inside = [s for s in spans if start <= s.start_us < end]
    collectives = [s for s in inside if is_collective(s, thread)]
    if not collectives:
        return 0.0, 0.0, 0
    backward = [s.end_us for s in inside if s.thread == thread and s.name.startswith(BACKWARD_PREFIX)]
    launches = [s.end_us for s in inside if s.thread == thread and s.name.startswith(LAUNCH_PREFIX)]
    computed = max(backward or launches or [min(s.start_us for s in collectives)])
    last = max(s.end_us for s in collectives)
    return union_us((s.start_us, s.end_us) for s in collectives), max(0.0, last - computed), len(collectives)


def comm_split(spans: Sequence[Span], max_steps: int | None = None) -> CommSplit | None:
    """Each profiled step's collective and exposed time, their medians (over the first
    ``max_steps`` steps: a step still open when the profiler stopped is left out); None
    without a step."""
    found = step_bounds(spans)
    if found is None:
        return None
    thread, bounds = found
    bounds = bounds[:max_steps] if max_steps else bounds
    per_step = [one_step(spans, thread, a, b) for a, b in bounds]
    return CommSplit(steps=len(per_step),
                     allreduce_ms=statistics.median(a for a, _, _ in per_step) / 1e3,
                     exposed_ms=statistics.median(e for _, e, _ in per_step) / 1e3,
                     collectives=float(statistics.median(n for _, _, n in per_step)),
                     step_ms=statistics.median(b - a for a, b in bounds) / 1e3)


def spans_of(prof: Any) -> list[Span]:
    """A finished ``torch.profiler.profile``'s CPU events as spans."""
    return [Span(e.name, int(e.thread), float(e.time_range.start), float(e.time_range.end))
            for e in prof.events() if e.time_range.end >= e.time_range.start]


__all__ = ["CommSplit", "Span", "comm_split", "is_collective", "spans_of", "step_bounds", "union_us"]

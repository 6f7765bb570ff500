"""A short probe of how fast this machine runs now: a small GEMM per dtype and a triad.

A cloud CPU is a slice of a shared host: a neighbour's load, the host's frequency and
memory traffic can make the same guest 30% slower in the afternoon than the morning its
profile was measured (``docs/shared-host.md``). The probe takes a fraction of a second, so
each job that holds figures against the cached peaks runs it first (``drift.py``) and
compares it with the probe the profile recorded when it was measured: a small GEMM runs
below the big-GEMM peak, so a probe is only ever compared with a probe of the same size.

A figure is the median of :data:`PROBE_SAMPLES` timed samples; its noise the samples'
interquartile range over the median (a robust spread: one preempted sample does not
widen it). The reference taken with the profile repeats the probe
:data:`REFERENCE_ROUNDS` times and keeps, per figure, the median of the rounds and the
larger of the rounds' range and their own noise: what the probe varies by on a machine
that did not change.
"""

from __future__ import annotations

import datetime as _dt
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ..errors import InputError
from ..vocabulary import TORCH_DTYPE

PROBE_GEMM_N = 512  # ~0.3 GFLOP a call: milliseconds on a few cores, well inside a core's caches' reach
PROBE_TRIAD_MIB = 96  # three arrays of 32 MiB: past a 32 MiB L3 slice, so memory is what it streams
PROBE_SAMPLES = 7
REFERENCE_ROUNDS = 3
TRIAD = "triad"  # the bandwidth figure's key beside the dtypes' GEMM figures
SAMPLE_BUDGET_S = 0.006  # each GEMM sample repeats the call for about this long


@dataclass(frozen=True)
class ProbeFigure:
    """One probed throughput (GFLOP/s for a GEMM, GB/s for the triad) and its relative noise."""

    value: float
    noise: float
    samples: int = PROBE_SAMPLES

    @classmethod
    def of(cls, values: Sequence[float]) -> "ProbeFigure":
        """The median of ``values`` and their interquartile range over it."""
        med = statistics.median(values)
        if len(values) >= 4:
            q1, _, q3 = statistics.quantiles(values, n=4)
        else:
            q1, q3 = min(values), max(values)
        return cls(float(med), float((q3 - q1) / med) if med > 0 else 0.0, len(values))

    def to_dict(self) -> dict[str, Any]:
        return {"value": round(self.value, 4), "noise": round(self.noise, 4), "samples": self.samples}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ProbeFigure":
        value = data.get("value")
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise InputError(f"a probe figure needs a positive 'value', not {value!r}")
        return cls(float(value), float(data.get("noise") or 0.0), int(data.get("samples") or 1))


@dataclass
class Probe:
    """One probe at ``threads`` threads: a figure per GEMM dtype and the triad (:data:`TRIAD`)."""

    threads: int
    figures: dict[str, ProbeFigure]
    taken: str = ""
    cost_s: float = 0.0
    gemm_n: int = PROBE_GEMM_N
    triad_mib: int = PROBE_TRIAD_MIB

    def to_dict(self) -> dict[str, Any]:
        return {"threads": self.threads, "taken": self.taken, "cost_s": round(self.cost_s, 4),
                "gemm_n": self.gemm_n, "triad_mib": self.triad_mib,
                "figures": {k: f.to_dict() for k, f in self.figures.items()}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Probe":
        figures = {str(k): ProbeFigure.from_dict(v) for k, v in (data.get("figures") or {}).items()}
        return cls(int(data.get("threads") or 1), figures, str(data.get("taken") or ""),
                   float(data.get("cost_s") or 0.0), int(data.get("gemm_n") or PROBE_GEMM_N),
                   int(data.get("triad_mib") or PROBE_TRIAD_MIB))


# A probe function: (threads, GEMM dtypes) -> Probe. Tests and what-ifs inject one.
ProbeFn = Callable[[int, Sequence[str]], Probe]


def _samples(fn: Callable[[], object], work: float, samples: int, budget_s: float) -> list[float]:
    """Throughputs (``work`` per second) of ``fn`` over ``samples`` timed samples after warm-up,
    each repeating the call for about ``budget_s``."""
    t0 = time.perf_counter()
    for _ in range(2):
        fn()
    one = max((time.perf_counter() - t0) / 2, 1e-7)
    inner = max(1, min(50, int(budget_s / one)))
    out = []
    for _ in range(samples):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        out.append(work * inner / max(time.perf_counter() - t0, 1e-9))
    return out


def run_probe(threads: int, dtypes: Sequence[str], *, gemm_n: int = PROBE_GEMM_N,
              triad_mib: int = PROBE_TRIAD_MIB, samples: int = PROBE_SAMPLES) -> Probe:
    """Probe this machine now at ``threads`` threads: an ``gemm_n``-cube matmul per dtype
    (GFLOP/s) and a STREAM triad over ``triad_mib`` MiB (GB/s), about 0.1-0.3 s in all."""
    import torch

    start = time.perf_counter()
    prev = torch.get_num_threads()
    torch.set_num_threads(max(1, int(threads)))
    figures: dict[str, ProbeFigure] = {}
    try:
        gen = torch.Generator().manual_seed(0)
        base_a, base_b = torch.randn(gemm_n, gemm_n, generator=gen), torch.randn(gemm_n, gemm_n, generator=gen)
        for dt in dtypes:
            tdt = getattr(torch, TORCH_DTYPE[dt])
            a, b = base_a.to(tdt), base_b.to(tdt)
            out = torch.empty(gemm_n, gemm_n, dtype=tdt)
            figures[dt] = ProbeFigure.of(_samples(lambda: torch.matmul(a, b, out=out),
                                                  2.0 * gemm_n ** 3 / 1e9, samples, SAMPLE_BUDGET_S))
        n = triad_mib * 2 ** 20 // 12
        b1, c1, a1 = torch.ones(n), torch.full((n,), 2.0), torch.empty(n)
        figures[TRIAD] = ProbeFigure.of(_samples(lambda: torch.add(b1, c1, alpha=3.0, out=a1),
                                                 12.0 * n / 1e9, samples, 0.0))
    finally:
        torch.set_num_threads(prev)
    return Probe(int(threads), figures, now_iso(), time.perf_counter() - start, gemm_n, triad_mib)


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclass
class ProbeReference:
    """The probes a machine profile recorded when it was measured, per thread count: each
    figure the median of :data:`REFERENCE_ROUNDS` probes, its noise the larger of the rounds'
    relative range and their own noise (how much the probe varies on an unchanged machine)."""

    by_threads: dict[int, dict[str, ProbeFigure]] = field(default_factory=dict)
    taken: str = ""
    rounds: int = REFERENCE_ROUNDS
    gemm_n: int = PROBE_GEMM_N
    triad_mib: int = PROBE_TRIAD_MIB

    def at(self, threads: int) -> tuple[int, dict[str, ProbeFigure]] | None:
        """The reference at ``threads``, else at the nearest recorded count below (above
        when none is below); None when nothing is recorded."""
        if not self.by_threads:
            return None
        below = [t for t in self.by_threads if t <= threads]
        t = threads if threads in self.by_threads else (max(below) if below else min(self.by_threads))
        return t, self.by_threads[t]

    def to_dict(self) -> dict[str, Any]:
        return {"taken": self.taken, "rounds": self.rounds, "gemm_n": self.gemm_n, "triad_mib": self.triad_mib,
                "figures": [{"threads": t, "kernel": k, **f.to_dict()}
                            for t, figs in sorted(self.by_threads.items()) for k, f in figs.items()]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> "ProbeReference | None":
        if not data or not data.get("figures"):
            return None
        by: dict[int, dict[str, ProbeFigure]] = {}
        for row in data["figures"]:
            by.setdefault(int(row.get("threads") or 1), {})[str(row.get("kernel"))] = ProbeFigure.from_dict(row)
        return cls(by, str(data.get("taken") or ""), int(data.get("rounds") or 1),
                   int(data.get("gemm_n") or PROBE_GEMM_N), int(data.get("triad_mib") or PROBE_TRIAD_MIB))


def combine_rounds(rounds: Sequence[Probe]) -> dict[str, ProbeFigure]:
    """Per figure of ``rounds`` (probes of an unchanged machine): the median value and the
    larger of the rounds' relative range and their median own noise."""
    out: dict[str, ProbeFigure] = {}
    for key in rounds[0].figures:
        values = [r.figures[key].value for r in rounds if key in r.figures]
        med = statistics.median(values)
        spread = (max(values) - min(values)) / med if med > 0 else 0.0
        own = statistics.median(r.figures[key].noise for r in rounds if key in r.figures)
        out[key] = ProbeFigure(float(med), float(max(spread, own)), sum(r.figures[key].samples for r in rounds
                                                                         if key in r.figures))
    return out


def reference_probes(thread_counts: Sequence[int], dtypes: Sequence[str], *, rounds: int = REFERENCE_ROUNDS,
                     probe: ProbeFn | None = None) -> ProbeReference:
    """The probe reference a freshly measured profile stores: ``rounds`` probes at each count."""
    fn = probe or run_probe
    by = {int(t): combine_rounds([fn(int(t), list(dtypes)) for _ in range(max(1, rounds))])
          for t in thread_counts}
    return ProbeReference(by, now_iso(), max(1, rounds))


__all__ = ["PROBE_GEMM_N", "PROBE_SAMPLES", "PROBE_TRIAD_MIB", "Probe", "ProbeFigure", "ProbeFn", "ProbeReference",
           "REFERENCE_ROUNDS", "TRIAD", "combine_rounds", "now_iso", "reference_probes", "run_probe"]

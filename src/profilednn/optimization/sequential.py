"""The sequential A/B test every arm kind goes through: paired rounds, the speedup's
interval, and a decision only when the interval makes one.

Each round times arm A and arm B back to back, the order alternating (A B, B A, ...); its
evidence is the log ratio ``ln(A / B)``. After every round the speedup's interval is
computed from the rounds so far (a t interval on the mean log ratio, its variance pooled
with this machine's A-vs-A rounds and the earlier A/Bs' round-to-round spread unless its
own rounds scatter beyond them, one outlier round left out; widened and moved when arm B
scatters more than arm A, step to step within a run or between its back-to-back samples),
and the test stops as soon as the interval lies
above the threshold (faster), below it (not faster), or the recipe's rounds or time run out,
or it can no longer be accepted within its rounds (undecided).
``docs/optimize.md`` writes the statistics down.

Torch-free: the rounds are callables that return milliseconds.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from .step_scatter import NONE, StepScatter, f_quantile, repeat_excess

CONFIDENCE = 0.95
"""The interval's coverage over the whole sequential test (all looks together)."""
LOOK_CONFIDENCE = 0.99
"""The confidence of each look: Pocock's constant boundary for about 10-20 looks keeps the
whole test's coverage near ``CONFIDENCE`` although it looks after every round."""
OUTLIER_MADS = 4.0
"""A round further than this many robust standard deviations (1.4826 MAD) from the median
log ratio is left out (one at most, from 5 rounds on)."""

POOL_GATE = 0.99
"""An A/B borrows the pooled noise only while its own rounds scatter no more than the pool
by an F test at this level: a stalled sample in one of its few rounds (a busy neighbour, a
collection) is then judged by the A/B's own rounds instead of being diluted by the pool's
quiet ones, which made it read as a speedup (``docs/optimize.md``)."""

POOL_GATE_FROM = 3
"""From this round on (two degrees of freedom of its own; t = 9.9 at the look's 99%) such an
A/B is judged alone: with one, it could bound nothing (t = 63.7). Two rounds that scatter
beyond the pool decide nothing yet: the A/B runs a third round where it may."""

FUTILITY_FROM = 4
"""From this round on an A/B also stops, undecided, once it can no longer be accepted within
its rounds (``SequentialTest.futile``)."""

Verdict = Literal["faster", "not faster", "undecided"]

RATIO_TEXT_LIMIT = 1000.0
"""A speedup bound beyond this factor either way is written as the limit it passes: with
one degree of freedom (t = 63.7) a round's bounds reach 1e-26x to 1e26x, which say no more
than that the interval does not yet bound anything."""


def ratio_text(x: float, digits: int = 3) -> str:
    """A speedup or one of its bounds as text, to ``digits`` decimals: "1.142", or ">1000" and
    "<0.001" (at ``digits``' resolution) beyond ``RATIO_TEXT_LIMIT``; the Run keeps the number."""
    if x > RATIO_TEXT_LIMIT:
        return f">{RATIO_TEXT_LIMIT:.0f}"
    floor = max(1.0 / RATIO_TEXT_LIMIT, 10.0 ** -digits)
    if x < floor:
        return f"<{floor:.{digits}f}"
    return f"{x:.{digits}f}"


def bounds_text(lo: float, hi: float, digits: int = 3, sep: str = "-") -> str:
    """An interval's bounds as text ("1.080-1.210"; "<0.001->1000" where it bounds nothing yet)."""
    return f"{ratio_text(lo, digits)}{sep}{ratio_text(hi, digits)}"


def t_quantile(p: float, df: float) -> float:
    """Student's t quantile (scipy's, imported here so that the CLI starts without it)."""
    from scipy.stats import t

    return float(t.ppf(p, df))


@dataclass
class Noise:
    """This machine's noise for the workload, pooled: the sum of squared log ratios of rounds
    that timed the same arm twice (their true ratio is 1) and how many there are; beside it
    the A/Bs' own rounds, each A/B's log ratios about their mean (n-1 degrees of freedom).
    An A/B's interval borrows both: on a slow machine whose budget allows two rounds an A/B
    has one degree of freedom of its own, and five earlier A/Bs lend it five more."""

    ss: float = 0.0
    df: int = 0
    paired_ss: float = 0.0
    paired_df: int = 0

    def add(self, log_ratios: Sequence[float]) -> None:
        """Pool A-vs-A log ratios (each has mean 0 by construction: one degree of freedom each)."""
        kept, _ = without_outlier(list(log_ratios))
        self.ss += sum(r * r for r in kept)
        self.df += len(kept)

    def add_repeats(self, samples_ms: Sequence[float]) -> None:
        """Pool arm A's samples from consecutive paired rounds as A-vs-A rounds: those that ran
        back to back (``back_to_back``), as a paired round's two arms do."""
        self.add(back_to_back(samples_ms, "a"))

    def add_paired(self, log_ratios: Sequence[float]) -> None:
        """Pool an A/B's paired rounds: their log ratios about their own mean (one outlier
        left out as in its interval), so a recipe's true speedup does not count as noise."""
        kept, _ = without_outlier(list(log_ratios))
        if len(kept) < 2:
            return
        self.paired_ss += _centred_ss(kept)
        self.paired_df += len(kept) - 1

    @property
    def pooled_ss(self) -> float:
        return self.ss + self.paired_ss

    @property
    def pooled_df(self) -> int:
        return self.df + self.paired_df

    @property
    def sd(self) -> float | None:
        """The standard deviation of one A-vs-A round's log ratio, None before any."""
        return math.sqrt(self.ss / self.df) if self.df else None

    @property
    def pooled_sd(self) -> float | None:
        """The standard deviation of one round's log ratio the intervals use (A-vs-A and
        the A/Bs' rounds together), None before any."""
        return math.sqrt(self.pooled_ss / self.pooled_df) if self.pooled_df else None

    @property
    def spread_pct(self) -> float | None:
        """How far one A-vs-A round's ratio strays from 1 in 95% of rounds, percent."""
        return _spread_pct(self.sd)

    @property
    def pooled_spread_pct(self) -> float | None:
        """The same for the pooled spread the intervals use."""
        return _spread_pct(self.pooled_sd)

    def detectable(self, threshold: float, rounds: int) -> float | None:
        """The speedup an A/B of ``rounds`` rounds accepts about half the time with this noise
        (its interval's lower bound then sits at ``threshold``): smaller true gains end
        inconclusive more often than not."""
        sd = self.pooled_sd
        if sd is None or rounds < 1:
            return None
        return threshold * math.exp(t_quantile(1.0 - (1.0 - LOOK_CONFIDENCE) / 2.0, rounds - 1 + self.pooled_df)
                                    * sd / math.sqrt(rounds))

    def to_dict(self) -> dict[str, float | int | None]:
        return {"rounds": self.df, "sd_log_ratio": self.sd, "spread_pct": self.spread_pct,
                "paired_df": self.paired_df, "pooled_sd_log_ratio": self.pooled_sd,
                "pooled_spread_pct": self.pooled_spread_pct}

    @classmethod
    def from_dict(cls, d: dict[str, float | int | None]) -> "Noise":
        """The noise a report's ``a_vs_a`` (:meth:`to_dict`) describes (a Run written before
        the A/Bs' rounds were pooled has no ``paired_df``)."""
        rounds, sd = int(d.get("rounds") or 0), d.get("sd_log_ratio")
        paired, pooled = int(d.get("paired_df") or 0), d.get("pooled_sd_log_ratio")
        df = rounds if sd is not None else 0
        ss = float(sd or 0.0) ** 2 * df
        if not paired or pooled is None:
            return cls(ss, df)
        return cls(ss, df, max(0.0, float(pooled) ** 2 * (df + paired) - ss), paired)

    def spread_text(self) -> str:
        """"one round of a setup against itself lands within ±4.1% in 95% of rounds (9 rounds)"."""
        if not self.df:
            return "not measured"
        return f"one round of a setup against itself lands within ±{self.spread_pct:.1f}% in 95% of rounds " \
               f"({self.df} rounds)"

    def pooled_text(self) -> str:
        """What the intervals use: "a round's ratio strays ±3.2% in 95% of rounds (9 A-vs-A
        rounds and 6 degrees of freedom of the A/Bs' own rounds)"."""
        spread = self.pooled_spread_pct
        if spread is None:
            return "not measured"
        return (f"a round's ratio strays ±{spread:.1f}% in 95% of rounds ({self.df} "
                f"A-vs-A rounds and {self.paired_df} degrees of freedom of the A/Bs' own rounds)")

    def describe(self) -> str:
        """One line for the terminal and the report."""
        line = f"A-vs-A noise: {self.spread_text()}"
        if self.paired_df:
            line += f"; pooled with the A/Bs' own rounds, as the intervals use it: {self.pooled_text()}"
        return line


@dataclass(frozen=True)
class Interval:
    """The speedup (A over B) its rounds support: point (geometric mean of the paired
    ratios; moved toward the arithmetic mean where B's steps scatter more, ``step_scatter.py``),
    low and high bounds, how many rounds and how many were left out as outliers."""

    point: float
    lo: float
    hi: float
    rounds: int
    dropped: int = 0
    df: int = 0  # the t quantile's degrees of freedom (its own rounds' and those it borrowed)
    scatter: float | None = None  # B's spread over A's, when the interval was widened for it
    scatter_of: str = "steps"  # what scattered: "steps" within a run, or back-to-back "samples"
    own_noise: bool = False  # its rounds scattered beyond the pooled noise: judged by them alone
    disputed: bool = False  # so did its two rounds, too few to judge alone: no decision yet

    def verdict(self, threshold: float) -> Verdict:
        if self.lo >= threshold:
            return "faster"
        if self.hi < threshold:
            return "not faster"
        return "undecided"

    def text(self) -> str:
        return f"{self.point:.3f}x [{bounds_text(self.lo, self.hi)}]"

    def as_list(self) -> list[float]:
        return [self.lo, self.hi]

    def scatter_text(self) -> str:
        """"B's steps scatter 3.2x as widely as A's within a run: the interval allows for it"
        ("B's back-to-back samples scatter ..." where those said more), "its rounds scatter
        beyond the pooled noise: judged by them alone" (or, of two rounds, "its two rounds
        scatter beyond the pooled noise"), both, or "" (neither)."""
        said = []
        if self.own_noise:
            said.append("its rounds scatter beyond the pooled noise: judged by them alone")
        if self.disputed:
            said.append("its two rounds scatter beyond the pooled noise")
        if self.scatter is not None:
            what = "steps" if self.scatter_of == "steps" else "back-to-back samples"
            where = " within a run" if self.scatter_of == "steps" else ""
            said.append(f"B's {what} scatter {self.scatter:.1f}x as widely as A's{where}: the interval allows for it")
        return "; ".join(said)


def back_to_back(samples_ms: Sequence[float], arm: Literal["a", "b"]) -> list[float]:
    """The log ratios of one arm's samples that ran back to back, in the order
    ``paired_rounds`` runs them (A B, B A, A B, ...): A's of rounds 1 and 2, 3 and 4, ...
    (its samples 0 and 1 did not: B ran between them); B's of rounds 0 and 1, 2 and 3, ..."""
    first = 1 if arm == "a" else 0
    return [math.log(x / y) for x, y in zip(samples_ms[first::2], samples_ms[first + 1::2]) if x > 0 and y > 0]


def _centred_ss(values: Sequence[float]) -> float:
    """The sum of squared deviations of ``values`` from their mean."""
    mean = statistics.fmean(values)
    return sum((v - mean) ** 2 for v in values)


def _spread_pct(sd: float | None) -> float | None:
    """How far a round's ratio strays from 1 in 95% of rounds (percent) at log-ratio sd ``sd``."""
    return None if sd is None else 100.0 * (math.exp(1.96 * sd) - 1.0)


def without_outlier(log_ratios: list[float]) -> tuple[list[float], int]:
    """``log_ratios`` less the one round furthest from the median when, from 5 rounds on, it
    lies beyond ``OUTLIER_MADS`` robust standard deviations; and how many were left out."""
    if len(log_ratios) < 5:
        return log_ratios, 0
    med = statistics.median(log_ratios)
    mad = 1.4826 * statistics.median(abs(r - med) for r in log_ratios)
    worst = max(range(len(log_ratios)), key=lambda i: abs(log_ratios[i] - med))
    if mad > 0 and abs(log_ratios[worst] - med) > OUTLIER_MADS * mad:
        return log_ratios[:worst] + log_ratios[worst + 1:], 1
    return log_ratios, 0


def log_ratios(pairs: Sequence[tuple[float, float]]) -> list[float]:
    """``ln(a / b)`` of each round (a round with a non-positive time carries no evidence)."""
    return [math.log(a / b) for a, b in pairs if a > 0 and b > 0]


def interval(pairs: Sequence[tuple[float, float]], noise: Noise | None = None,
             confidence: float = LOOK_CONFIDENCE, steps: StepScatter | None = None) -> Interval | None:
    """The speedup's interval from paired rounds (A ms, B ms), its variance pooled with
    ``noise``; widened and moved where B scatters more than A, by its runs' ``steps`` or its
    back-to-back samples, whichever says more (``step_scatter.py``); None while there is no
    spread to judge by (one round and no A-vs-A rounds)."""
    kept, dropped = without_outlier(log_ratios(pairs))
    n = len(kept)
    prior = noise or Noise()
    beyond = scatters_beyond_pool(kept, prior)
    alone, disputed = beyond and n >= POOL_GATE_FROM, beyond and n < POOL_GATE_FROM
    if alone:
        prior = Noise()
    df = n - 1 + prior.pooled_df
    if n == 0 or df < 1:
        return None
    within = steps.excess() if steps is not None else NONE
    repeated = repeat_excess(back_to_back([b for _, b in pairs], "b"), prior.pooled_ss, prior.pooled_df)
    widening, of = (repeated, "samples") if repeated.variance > within.variance else (within, "steps")
    mean = statistics.fmean(kept) - widening.shift
    variance = (_centred_ss(kept) + prior.pooled_ss) / df + widening.variance
    half = t_quantile(1.0 - (1.0 - confidence) / 2.0, df) * math.sqrt(variance / n)
    return Interval(math.exp(mean), math.exp(mean - half), math.exp(mean + half), n + dropped, dropped, df,
                    widening.ratio, of, alone, disputed)


def scatters_beyond_pool(kept: Sequence[float], noise: Noise) -> bool:
    """Do an A/B's log ratios ``kept`` scatter about their mean more than ``noise``'s pool
    allows (an F test at ``POOL_GATE``)? Then the pool does not describe its rounds: a
    stalled sample among them, diluted by twenty quiet pooled rounds, read as a speedup
    (``tests/test_sequential.py``)."""
    n = len(kept)
    if n < 2 or noise.pooled_df < 1 or noise.pooled_ss <= 0:
        return False
    ratio = (_centred_ss(kept) / (n - 1)) / (noise.pooled_ss / noise.pooled_df)
    return ratio > f_quantile(POOL_GATE, n - 1, noise.pooled_df)


@dataclass
class SequentialTest:
    """When a paired A/B stops: once its interval decides against ``threshold``, after
    ``max_rounds``, or when another round would end past ``deadline`` (``time.monotonic()``;
    after ``min_rounds``). ``threshold=None`` never decides (a fixed number of rounds)."""

    threshold: float | None
    max_rounds: int
    noise: Noise = field(default_factory=Noise)
    deadline: float | None = None
    min_rounds: int = 1
    left: Callable[[], str] = lambda: ""  # the search's time left, for progress
    steps: StepScatter = field(default_factory=StepScatter)  # runs' steps, where a round is a run

    def interval(self, pairs: Sequence[tuple[float, float]]) -> Interval | None:
        return interval(pairs, self.noise, steps=self.steps)

    def verdict(self, pairs: Sequence[tuple[float, float]]) -> Verdict:
        return self.judged(self.interval(pairs))

    def judged(self, found: Interval | None) -> Verdict:
        """What ``found`` (an interval of this test's rounds) decides."""
        return "undecided" if found is None or self.threshold is None else found.verdict(self.threshold)

    def done(self, rounds: int, found: Interval | None, round_s: float) -> bool:
        """Stop after ``rounds`` rounds whose interval is ``found`` (the last round took ``round_s`` seconds)?"""
        if rounds >= self.max_rounds:
            return True
        if rounds < self.min_rounds:
            return False
        decided = self.judged(found) != "undecided" and not (found is not None and found.disputed)
        if decided or self.futile(rounds, found):
            return True
        return self.deadline is not None and time.monotonic() + round_s > self.deadline

    def futile(self, rounds: int, found: Interval | None) -> bool:
        """Can the A/B no longer be accepted within ``max_rounds``? At its last round the
        interval's lower bound clears the threshold only if its point reaches threshold x
        e^h, h the half-width the per-round spread seen so far gives at ``max_rounds``. When
        the present upper bound (the largest speedup the rounds so far allow) is already below
        that, even a true speedup that large is accepted less than half the time, and a true
        speedup near the point almost never: the rest of the rounds would be spent on a
        recipe that ends not accepted anyway (on synthetic streams it cuts a no-effect
        recipe's rounds by a third and accepts the same recipes, ``tests/test_sequential.py``)."""
        if (found is None or self.threshold is None or rounds < FUTILITY_FROM or rounds >= self.max_rounds
                or found.df < 1):
            return False
        n = found.rounds - found.dropped
        borrowed = found.df - (n - 1)  # the pooled noise's degrees of freedom it used
        level = 1.0 - (1.0 - LOOK_CONFIDENCE) / 2.0
        sd = math.log(found.hi / found.point) * math.sqrt(n) / t_quantile(level, found.df)
        half_at_end = t_quantile(level, self.max_rounds - 1 + borrowed) * sd / math.sqrt(self.max_rounds)
        return math.log(found.hi) < math.log(self.threshold) + half_at_end


def fixed(rounds: int) -> SequentialTest:
    """Exactly ``rounds`` rounds, no decision (a measurement, not a test)."""
    return SequentialTest(None, rounds, min_rounds=rounds)


def paired_rounds(sample_a: Callable[[int], float], sample_b: Callable[[int], float], test: SequentialTest,
                  on_round: Callable[[int, Interval | None], None] | None = None) -> list[tuple[float, float]]:
    """Rounds of one A and one B sample each (``sample_x(round)`` returns ms), A first in
    even rounds and B first in odd ones, until ``test`` says stop; the (A, B) pairs."""
    pairs: list[tuple[float, float]] = []
    while True:
        started, r = time.monotonic(), len(pairs)
        if r % 2 == 0:
            a = sample_a(r)
            b = sample_b(r)
        else:
            b = sample_b(r)
            a = sample_a(r)
        pairs.append((a, b))
        found = test.interval(pairs)
        if on_round is not None:
            on_round(r + 1, found)
        if test.done(len(pairs), found, time.monotonic() - started):
            return pairs


def round_line(label: str, done: int, test: SequentialTest, found: Interval | None) -> str:
    """Progress after a round: "bf16: round 3 of at most 12, 1.874x [1.712-2.051], 11m02s left"."""
    figure = found.text() if found is not None else "no interval yet"
    left = test.left()
    return f"{label}: round {done} of at most {test.max_rounds}, {figure}" + (f", {left}" if left else "")


__all__ = ["CONFIDENCE", "FUTILITY_FROM", "LOOK_CONFIDENCE", "POOL_GATE", "POOL_GATE_FROM", "RATIO_TEXT_LIMIT",
           "Interval", "Noise", "SequentialTest", "Verdict", "back_to_back", "bounds_text", "fixed", "interval",
           "log_ratios", "paired_rounds", "ratio_text", "round_line", "scatters_beyond_pool", "t_quantile",
           "without_outlier"]

"""Whether an A/B's arm B scatters more than arm A, and by how much it widens the interval.

The pooled noise of ``sequential.py`` assumes every A/B's arms scatter as the stock arms
did. When B scatters more (DataLoader workers contending, a recompiling graph), a few rounds
of its own cannot show it. Two things can: where a round is a run (child processes), the
steps within each run (many degrees of freedom, ``StepScatter``); and in every A/B, B's
samples that ran back to back (rounds alternate A B, B A), against the pooled noise's
same-arm pairs (``repeat_excess``). ``docs/optimize.md`` writes the statistics down.

Torch-free.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

SCATTER_GATE = 0.95
"""An interval allows for B scattering more than A only when an F test of their variances
says so at this level (arms that scatter alike keep their intervals 19 times in 20 or more)."""
MIN_STEP_DF = 3
"""The steps an arm's spread needs (degrees of freedom, a run of m steps giving m - 1): from
fewer, one stalled step sets the median of the deviations, and a run of two steps has no
median that a stall cannot move."""

# Run sizes' constants for normal steps, computed once by simulation (40,000 runs each):
# MAD_SCALE[m] turns the median absolute deviation from a run's median (the median's own zero
# left out when m is odd) into a consistent sd for runs of m steps, as 1.4826 does for large
# ones; MEDIAN_VARIANCE[m] is m times the variance of the median of m steps over the steps'
# variance (pi/2 for large runs).
MAD_SCALE = {2: 2.107, 3: 1.450, 4: 2.051, 5: 1.453, 6: 1.890, 7: 1.461, 8: 1.770, 9: 1.466, 10: 1.713,
             11: 1.471, 12: 1.666}
MEDIAN_VARIANCE = {2: 1.0, 3: 1.335, 4: 1.198, 5: 1.429, 6: 1.293, 7: 1.462, 8: 1.347, 9: 1.497,
                   10: 1.380, 11: 1.514, 12: 1.422}


class Widening(NamedTuple):
    """What B's extra scatter does to an A/B's interval: the variance it adds to one round's
    log ratio, B's spread over A's (None: no widening), and the shift of the mean log ratio
    that puts B back on the arithmetic mean: a log scale favours the noisier arm (a sample's
    expected log is ``ln(mean) - sd^2 / 2``), so a recipe that only makes the step scatter
    would otherwise look faster."""

    variance: float = 0.0
    ratio: float | None = None
    shift: float = 0.0


NONE = Widening()


@dataclass
class StepScatter:
    """Each arm's timed steps, run by run (log ms): :meth:`excess` is the variance B's steps
    add to one round's log ratio beyond A's, estimated robustly from the steps."""

    runs: dict[str, list[list[float]]] = field(default_factory=lambda: {"a": [], "b": []})

    def add(self, arm: str, steps_ms: Sequence[float]) -> None:
        """One run's timed steps of ``arm`` ("a" or "b")."""
        logs = [math.log(ms) for ms in steps_ms if ms > 0]
        if len(logs) >= 2:
            self.runs[arm].append(logs)

    def spread(self, arm: str) -> tuple[float, int, float] | None:
        """``arm``'s step sd (log ms, robust), its degrees of freedom and the variance of one
        run's log median it implies; None before any run of two steps or more."""
        runs = self.runs[arm]
        if not runs:
            return None
        deviations: list[float] = []
        for logs in runs:
            mid = statistics.median(logs)
            scale = MAD_SCALE.get(len(logs), 1.4826)
            ordered = sorted(abs(v - mid) for v in logs)
            deviations += [scale * d for d in (ordered[1:] if len(logs) % 2 else ordered)]
        sd = statistics.median(deviations)
        size = round(statistics.median(len(logs) for logs in runs))
        per_run = MEDIAN_VARIANCE.get(size, math.pi / 2) * sd * sd / size
        return sd, sum(len(logs) - 1 for logs in runs), per_run

    def excess(self) -> Widening:
        """What B's steps scattering more than A's within a run does to the interval (the
        variance of a run's median, the shift of half the steps' variances); none unless each
        arm has ``MIN_STEP_DF`` steps to judge by and an F test on the robust spreads'
        effective degrees of freedom says B's scatter more (``SCATTER_GATE``)."""
        a, b = self.spread("a"), self.spread("b")
        if a is None or b is None or min(a[1], b[1]) < MIN_STEP_DF or a[0] <= 0 or b[2] <= a[2]:
            return NONE
        if (b[0] / a[0]) ** 2 <= _critical(effective_df(b[1]), effective_df(a[1])):
            return NONE
        return Widening(b[2] - a[2], b[0] / a[0], (b[0] ** 2 - a[0] ** 2) / 2.0)


def effective_df(df: int) -> float:
    """The degrees of freedom a robust spread of ``df`` steps is worth in an F test: a median
    of absolute deviations scatters more than a variance of as many steps (37% as efficient
    in large samples), so counting every step made the gate pass alike arms 10-18% of the
    time, not 5%. Fitted by simulation of alike normal arms (runs of 3-10 steps, 1-12 runs
    an arm), on the conservative side for every run size (``docs/optimize.md``)."""
    return min(float(df), 0.25 * df + 1.0)


def f_quantile(p: float, df_num: float, df_den: float) -> float:
    """The F distribution's quantile (scipy's, imported here so that the CLI starts without
    it): the critical ratio of two variances at level ``p``."""
    from scipy.stats import f

    return float(f.ppf(p, df_num, df_den))


def _critical(df_b: float, df_a: float) -> float:
    """The F test's critical ratio of B's variance over A's at ``SCATTER_GATE``."""
    return f_quantile(SCATTER_GATE, df_b, df_a)


def repeat_excess(repeats: Sequence[float], pooled_ss: float, pooled_df: int) -> Widening:
    """The variance B adds to one round's log ratio beyond A's, judged from the log ratios of
    B's samples that ran back to back (``sequential.back_to_back``) against the pooled noise
    (``pooled_ss`` on ``pooled_df``: A-vs-A rounds and earlier A/Bs' rounds, each the log
    ratio of two samples of alike arms) and B's spread over A's; none unless the F test says
    B scatters more (``SCATTER_GATE``). It does not move the point: from one or two pairs the
    difference is far too uncertain for that (one stalled 1 ms step among them read as a 6x
    spread and would have moved a 0.81x to 0.37x); only the steps' robust spread moves it.
    It widens by the excess the F test vouches for, B's variance over its critical value (the
    lower confidence bound of B's variance), not by the estimate: from one or two pairs the
    estimate is as often several times too large, and on a busy machine one pair with a
    stalled sample had turned intervals of 2 rounds into 0.0003x-13,000x."""
    if not repeats or pooled_df < 1 or pooled_ss <= 0:
        return NONE
    var_b, var_a = sum(r * r for r in repeats) / len(repeats), pooled_ss / pooled_df
    critical = _critical(len(repeats), pooled_df)
    if var_b / var_a <= critical:
        return NONE
    return Widening((var_b / critical - var_a) / 2.0, math.sqrt(var_b / var_a))  # a same-arm ratio: twice a sample's


__all__ = ["MAD_SCALE", "MEDIAN_VARIANCE", "MIN_STEP_DF", "NONE", "SCATTER_GATE", "StepScatter", "Widening",
           "effective_df", "f_quantile", "repeat_excess"]

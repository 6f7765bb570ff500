"""The search's time budget: each A/B gets its test, with a share of the time left.

The budget (``--time-budget``) is planned, not just enforced: before each recipe's A/B the
time left is split evenly over the recipes still to try that apply to the arm as it stands
(``search.applying``: one skipped takes no time) and the final total, so an early recipe
that cannot decide does not eat the later ones' rounds, and none is cut short for recipes
that will not run. An A/B always runs its minimum rounds, so every recipe is measured even
when the budget is spent; the report says so. The pooled A-vs-A noise lives here too: every A/B's interval is judged by it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .sequential import Noise, SequentialTest

MIN_ROUNDS = 2
"""Rounds every A/B runs before it may stop (one of each order)."""


def duration(seconds: float) -> str:
    """``14m05s``, ``52s``."""
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


@dataclass
class Budget:
    """The whole search's time (``seconds``; None: no limit but the rounds), the recipes
    still to try, and the A-vs-A noise pooled so far."""

    seconds: float | None
    threshold: float
    noise: Noise = field(default_factory=Noise)
    started: float = field(default_factory=time.monotonic)
    recipes_left: int = 0  # the A/Bs still to run, this one included (the search sets it)
    overrun: bool = False  # some A/B started with the budget spent: its minimum rounds only

    def left_s(self) -> float | None:
        return None if self.seconds is None else self.seconds - (time.monotonic() - self.started)

    def left_text(self) -> str:
        left = self.left_s()
        if left is None:
            return ""
        if left <= 0:
            return f"the {duration(self.seconds or 0)} budget is spent: minimum rounds only"
        return f"{duration(left)} of the {duration(self.seconds or 0)} budget left"

    def test(self, max_rounds: int, final: bool = False) -> SequentialTest:
        """The test of the next A/B: at most ``max_rounds`` rounds, and its even share of the
        time left (the final total gets all of what is left)."""
        left = self.left_s()
        self.overrun = self.overrun or (left is not None and left <= 0)  # this A/B gets its minimum rounds only
        share = None if left is None else max(0.0, left) / (1 if final else self.recipes_left + 1)
        return SequentialTest(self.threshold, max_rounds, self.noise,
                              deadline=None if share is None else time.monotonic() + share,
                              min_rounds=min(MIN_ROUNDS, max_rounds), left=self.left_text)

    def describe(self) -> str:
        """What the budget came to, for the report's notes."""
        spent = time.monotonic() - self.started
        if self.seconds is None:
            return f"the search took {duration(spent)} (no time budget)"
        line = f"the search took {duration(spent)} of its {duration(self.seconds)} budget"
        return line + ("; some A/Bs ran only their minimum rounds because the budget was spent" if self.overrun else "")


__all__ = ["MIN_ROUNDS", "Budget", "duration"]

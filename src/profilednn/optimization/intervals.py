"""How the sequential test's intervals are shown: a recipe's speedup interval, the measured
gain's interval derived from it, the outcome word and the A-vs-A noise line, read from a
``RecipeResult.to_dict()`` or from a Run's ``optimize_recipes`` row alike.

A ``to_dict()`` carries the interval as ``speedup_ci`` ([lo, hi]); the Run's table holds it
as ``speedup_lo``/``speedup_hi`` with ``measured_gain_lo``/``measured_gain_hi`` beside them
(:func:`interval_columns` fills them). Rows of an older Run have neither: every function
here then answers None (or the decision's first word for the outcome). Plain Python.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from .sequential import Noise, bounds_text

INTERVAL_COLUMNS = ("speedup_lo", "speedup_hi", "measured_gain_lo", "measured_gain_hi")
"""The ``optimize_recipes`` columns :func:`interval_columns` derives from ``speedup_ci``."""


def gain_pct(speedup: float) -> float:
    """The step time a speedup saves, percent of the step before: ``100 (1 - 1/speedup)``."""
    return 100.0 * (1.0 - 1.0 / speedup) if speedup > 0 else -math.inf


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def speedup_interval(row: Mapping[str, Any]) -> tuple[float, float] | None:
    """[lo, hi] of a row's speedup: its ``speedup_ci``, else its ``speedup_lo``/``speedup_hi``."""
    ci: Sequence[Any] | None = row.get("speedup_ci")
    lo, hi = (ci[0], ci[1]) if ci is not None and len(ci) == 2 else (row.get("speedup_lo"), row.get("speedup_hi"))
    lo, hi = _finite(lo), _finite(hi)
    return None if lo is None or hi is None else (lo, hi)


def measured_gain_ci(speedup_ci: Sequence[float] | None) -> tuple[float, float] | None:
    """The measured gain's interval (percent of the step) at the speedup interval's bounds."""
    if speedup_ci is None or len(speedup_ci) != 2 or min(speedup_ci) <= 0:
        return None
    return gain_pct(speedup_ci[0]), gain_pct(speedup_ci[1])


def gain_interval(row: Mapping[str, Any]) -> tuple[float, float] | None:
    """[lo, hi] of a row's measured gain: its ``measured_gain_lo``/``_hi``, else from its speedup interval."""
    lo, hi = _finite(row.get("measured_gain_lo")), _finite(row.get("measured_gain_hi"))
    if lo is not None and hi is not None:
        return lo, hi
    return measured_gain_ci(speedup_interval(row))


def interval_columns(row: Mapping[str, Any]) -> dict[str, float | None]:
    """The ``optimize_recipes`` interval columns of a ``RecipeResult.to_dict()``: the speedup's
    bounds and the measured gain's bounds (percent), None where there is no interval."""
    speed, gain = speedup_interval(row) or (None, None), gain_interval(row) or (None, None)
    return dict(zip(INTERVAL_COLUMNS, (*speed, *gain)))


OUTCOMES = ("accepted", "rejected", "inconclusive", "skipped")
"""The words a decision line starts with (``RecipeResult.outcome``)."""


def outcome_of(decision: str) -> str:
    """A decision line's outcome word (one of ``OUTCOMES``), "" when it starts with none."""
    head = decision.split(":", 1)[0]
    return head if head in OUTCOMES else ""


def outcome(row: Mapping[str, Any]) -> str:
    """accepted, rejected, inconclusive or skipped: the row's ``outcome``, else (a row of an
    older Run) its decision's first word when it is one of them, "accepted" when the row
    was, else ""."""
    found = row.get("outcome")
    if found:
        return str(found)
    return outcome_of(str(row.get("decision") or "")) or ("accepted" if row.get("accepted") else "")


def speedup_text(speedup: float | None, ci: tuple[float, float] | None, digits: int = 3, sep: str = " ") -> str:
    """``1.142x [1.08-1.21]`` (the interval's bounds to 2 decimals, after ``sep``); ``1.142x``
    without one; "" without a speedup."""
    if speedup is None:
        return ""
    return f"{speedup:.{digits}f}x" + ("" if ci is None else f"{sep}[{bounds_text(ci[0], ci[1], 2)}]")


def gain_text(gain: float | None, ci: tuple[float, float] | None) -> str:
    """``12.3% [7.1 to 16.9%]`` (bounds may be negative); ``12.3%`` without an interval; "n/a" without a gain."""
    if gain is None:
        return "n/a"
    return f"{gain:.1f}%" + ("" if ci is None else f" [{ci[0]:.1f} to {ci[1]:.1f}%]")


def noise_line(a_vs_a: Mapping[str, Any] | None) -> str | None:
    """The A-vs-A noise sentence of a report's ``a_vs_a`` (``Noise.to_dict``); None without one."""
    if not a_vs_a:
        return None
    return Noise.from_dict(dict(a_vs_a)).describe()


__all__ = ["INTERVAL_COLUMNS", "OUTCOMES", "gain_interval", "gain_pct", "gain_text", "interval_columns",
           "measured_gain_ci", "noise_line", "outcome", "outcome_of", "speedup_interval", "speedup_text"]

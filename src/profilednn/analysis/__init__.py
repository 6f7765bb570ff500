"""Analysis: turn a Run (or a bare verbose log) into breakdowns, comparisons and advice.

``Analysis(run)`` is the facade; its methods delegate to one module per analyzer
(``breakdown``, ``compare``, ``fragmentation``, ``advice``), each a set of functions
that take tables and return polars DataFrames.
"""

from __future__ import annotations

from .advice import advice_json
from .compare import Comparison
from .facade import Analysis, advise, compare
from .rulebook import Advice
from .rules import RULES
from .source import LogSource, open_source

__all__ = [
    "Advice",
    "Analysis",
    "Comparison",
    "LogSource",
    "RULES",
    "advice_json",
    "advise",
    "compare",
    "open_source",
]

"""The analysis job's Python API: ``Analysis`` (one Run or log), ``advise``, ``compare``;
what ``profilednn report`` / ``compare`` analyse with, and what ``profilednn`` exports."""

from __future__ import annotations

from . import RULES, Advice, Analysis, Comparison, advice_json, advise, compare

__all__ = ["Advice", "Analysis", "Comparison", "RULES", "advice_json", "advise", "compare"]

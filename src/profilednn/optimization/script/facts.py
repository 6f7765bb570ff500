"""What an arm saw of the user's script: the types live in ``optimization/script_facts.py``
(the recipe modules read them too, and may not import ``script/``); re-exported here."""

from __future__ import annotations

from ..script_facts import DdpFacts, OptimizerFacts, RootFacts, ScriptFacts

__all__ = ["DdpFacts", "OptimizerFacts", "RootFacts", "ScriptFacts"]

"""The advice rule set, named in one place: the rule modules, in order, and the ranking of
the advice their rules give.

A rule module defines ``@rule`` functions, each taking a ``view.RunView``, and imports only
the rulebook and ``view`` below it (never the ``Analysis`` facade); ``RULE_MODULES``
lists every one (a new rule module is added here), and ``RULES`` is what they define.
Nothing registers as a side effect of an import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import (
    conv_rules,
    dropout_rules,
    environment_rules,
    fragmentation_rules,
    model_rules,
    optimizer_rules,
    precision_rules,
    weight_grad_rules,
)
from .rulebook import SEVERITIES, Advice, Rule, rules_in

if TYPE_CHECKING:
    from .view import RunView

RULE_MODULES = (model_rules, environment_rules, fragmentation_rules, precision_rules, conv_rules, weight_grad_rules,
                optimizer_rules, dropout_rules)
RULES: dict[str, Rule] = rules_in(*RULE_MODULES)


def rank_advice(analysis: "RunView", rules: dict[str, Rule] | None = None) -> list[Advice]:
    """Every rule that fires on ``analysis``, ranked by estimated gain (largest first).
    ``profilednn.analysis.advise`` takes a Run, log or path as well."""
    found = [adv for fn in (rules or RULES).values() if (adv := fn(analysis)) is not None]
    order = {s: i for i, s in enumerate(SEVERITIES)}
    return sorted(found, key=lambda x: (-x.estimated_gain_pct, order.get(x.severity, 9), x.rule))


__all__ = ["RULES", "RULE_MODULES", "rank_advice"]

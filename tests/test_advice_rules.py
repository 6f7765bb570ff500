"""The advice rule set is listed, not registered by import side effects: ``analysis/rules.py``
names every rule module and collects what each defines."""

from __future__ import annotations

import types

import pytest

from profilednn.analysis import RULES
from profilednn.analysis import advice, conv_rules, dropout_rules, optimizer_rules, precision_rules, weight_grad_rules
from profilednn.analysis.rulebook import rule, rules_in
from profilednn.analysis.rules import RULE_MODULES


def _module(name: str, **functions: object) -> types.ModuleType:
    module = types.ModuleType(name)
    for fn in functions.values():
        fn.__module__ = name  # type: ignore[attr-defined]
    vars(module).update(functions)
    return module


def test_the_rule_set_is_every_rule_of_the_listed_modules() -> None:
    assert RULE_MODULES == (advice, precision_rules, conv_rules, weight_grad_rules, optimizer_rules, dropout_rules)
    assert {"channels_last", "bf16_native", "native_conv_fallback", "conv_weight_grad", "fused_optimizer",
            "dropout_masks"} <= set(RULES)
    assert [RULES[name].__module__ for name in RULES] == sorted(
        (fn.__module__ for fn in RULES.values()), key=[m.__name__ for m in RULE_MODULES].index)


def test_rules_are_collected_in_definition_order_and_imports_are_not_rules() -> None:
    first = rule("first")(lambda a: None)
    second = rule("second")(lambda a: None)
    mod = _module("rules_a", first=first, second=second)
    assert list(rules_in(mod)) == ["first", "second"]
    borrowed = types.ModuleType("rules_b")
    vars(borrowed).update(first=first)  # imported from rules_a: not rules_b's rule
    assert rules_in(borrowed) == {}


def test_two_rules_with_one_name_are_refused() -> None:
    a = _module("rules_c", f=rule("same")(lambda x: None))
    b = _module("rules_d", g=rule("same")(lambda x: None))
    with pytest.raises(ValueError, match="two advice rules are named 'same'"):
        rules_in(a, b)

"""The advice rule set is listed, not registered by import side effects: ``analysis/rules.py``
names every rule module and collects what each defines."""

from __future__ import annotations

import types

import pytest

from profilednn.analysis import RULES, advice
from profilednn.analysis.facade import Analysis
from profilednn.analysis.rulebook import rule, rules_in
from profilednn.analysis.rules import RULE_MODULES
from profilednn.analysis.view import RunBreakdowns, RunView

# the rule modules analysis/advice.py was split into, by concern; it re-exports their names
SPLIT_FROM_ADVICE = ("model_rules", "environment_rules", "fragmentation_rules")


def _module(name: str, **functions: object) -> types.ModuleType:
    module = types.ModuleType(name)
    for fn in functions.values():
        fn.__module__ = name  # type: ignore[attr-defined]
    vars(module).update(functions)
    return module


def test_the_rule_set_is_every_rule_of_the_listed_modules() -> None:
    assert [m.__name__ for m in RULE_MODULES] == [f"profilednn.analysis.{name}" for name in (
        *SPLIT_FROM_ADVICE, "precision_rules", "conv_rules", "weight_grad_rules", "optimizer_rules", "dropout_rules")]
    assert {"channels_last", "bf16_native", "native_conv_fallback", "conv_weight_grad", "fused_optimizer",
            "dropout_masks"} <= set(RULES)
    assert [RULES[name].__module__ for name in RULES] == sorted(
        (fn.__module__ for fn in RULES.values()), key=[m.__name__ for m in RULE_MODULES].index)


def test_advice_keeps_the_names_of_the_rules_it_held() -> None:
    # analysis/advice.py was split by concern; its names still import from it.
    split = RULE_MODULES[:len(SPLIT_FROM_ADVICE)]
    assert [m.__name__.rpartition(".")[2] for m in split] == list(SPLIT_FROM_ADVICE)
    for module in split:
        for name in module.__all__:
            assert getattr(advice, name) is getattr(module, name)
    assert [name for name in RULES if RULES[name].__module__ in {m.__name__ for m in split}] == [
        "channels_last", "bf16_without_native_bf16", "fused_loss", "frozen_weight_grads", "frozen_batchnorm_unfused",
        "batchnorm_passes", "threads_vs_cores", "allocator", "data_loading", "fragmentation"]


def test_the_facade_is_the_view_the_rules_read() -> None:
    # Rules take a RunView, the comparison a RunBreakdowns; Analysis has every member of both.
    members = {name for proto in (RunView, RunBreakdowns) for name in vars(proto) if not name.startswith("_")}
    assert {"primitives", "ops", "layers", "steps", "n_steps", "step_ms", "fingerprint", "need"} <= members
    assert [name for name in sorted(members) if not hasattr(Analysis, name)] == []


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

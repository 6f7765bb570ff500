"""``frozen_weight_grads``: frozen layers left to autograd (seed 000, 2.5 and 2.7).

Parameters that still require grad but that no optimizer changes (in no param group, or in a
group with lr 0) make autograd compute weight gradients nobody uses; setting
``requires_grad=False`` on them skips those convolutions (and, when a whole prefix of the
network is frozen, its backward entirely). In a script the same happens at a root module's
first call, once an optimizer exists. (``frozen_batchnorm`` lives in ``frozen_batchnorm.py``;
its names are re-exported here, their old home.)
"""

from __future__ import annotations

from collections.abc import Collection

from torch import nn

from ..train_step import TrainStep
from .frozen_batchnorm import ConvFrozenBN2d, FrozenBatchNorm, FusedFrozenBatchNorm2d, conv_bn_pairs
from .injection import Injection, ScriptProcess
from .recipe_contract import Context, Recipe
from .script_facts import RootFacts, ScriptFacts, no_root


def unused_trainable(setup: TrainStep) -> list[tuple[str, nn.Parameter]]:
    """Parameters that require grad but that the optimizer never changes: in no param
    group, or in a group whose learning rate is 0."""
    updated: set[int] = set()
    for group in setup.optimizer.param_groups:
        if float(group.get("lr", 1.0)) != 0.0:
            updated.update(id(p) for p in group["params"])
    seen: set[int] = set()
    out = []
    for name, p in setup.model.named_parameters():
        if p.requires_grad and id(p) not in updated and id(p) not in seen:
            out.append((name, p))
        seen.add(id(p))
    return out


class FrozenWeightGrads(Recipe):
    name = "frozen_weight_grads"
    family = "frozen layers"
    summary = "requires_grad=False on parameters no optimizer updates: autograd skips their weight gradients"

    def check(self, setup: TrainStep, ctx: Context) -> str | None:
        if unused_trainable(setup):
            return None
        frozen = [p for p in setup.model.parameters() if not p.requires_grad]
        if frozen:
            return (f"already done: the {len(frozen)} frozen parameter tensors "
                    f"({sum(p.numel() for p in frozen):,} values) have requires_grad=False, and every "
                    "parameter that requires grad is updated")
        return "every parameter is trained: nothing is frozen"

    def apply(self, setup: TrainStep, ctx: Context) -> str:
        unused = unused_trainable(setup)
        for _, p in unused:
            p.requires_grad_(False)
        shown = ", ".join(name for name, _ in unused[:4]) + (f" and {len(unused) - 4} more" if len(unused) > 4 else "")
        return (f"requires_grad=False on {len(unused)} parameter tensors the optimizer never updates "
                f"({sum(p.numel() for _, p in unused):,} values: {shown})")

    def script_check(self, facts: ScriptFacts, ctx: Context, accepted: Collection[str] = ()) -> str | None:
        if no_root(facts):
            return no_root(facts)
        if facts.unused_trainable == 0:
            return "every parameter that requires grad is updated by an optimizer: nothing is frozen by hand"
        return None

    def code_edit(self, facts: ScriptFacts) -> str | None:
        return "p.requires_grad_(False) for every parameter no optimizer updates"

    def injection(self) -> Injection:
        return FreezeUnused()


class FreezeUnused(Injection):
    """At a root's first call: ``requires_grad=False`` on its parameters no optimizer updates
    (none when no optimizer exists yet: nothing is known to be unused)."""

    def inject_root(self, process: ScriptProcess, module: nn.Module, facts: RootFacts) -> None:
        updated = process.updated_parameters()
        if not updated:
            return
        unused = [p for p in module.parameters() if p.requires_grad and id(p) not in updated]
        for p in unused:
            p.requires_grad_(False)
        if unused:
            process.said(RECIPE.name, f"requires_grad=False on {len(unused)} parameter tensors no optimizer "
                         f"updates ({sum(p.numel() for p in unused):,} values)")


RECIPE = FrozenWeightGrads()

__all__ = [
    "ConvFrozenBN2d",
    "FrozenBatchNorm",
    "FrozenWeightGrads",
    "FusedFrozenBatchNorm2d",
    "conv_bn_pairs",
    "unused_trainable",
]

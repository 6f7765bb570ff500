"""What the ``DistributedDataParallel`` recipes share (``ddp_bucket_view``, ``ddp_static_graph``,
``ddp_bucket_size``, ``ddp_bf16_allreduce``): they reach only a script that wraps its model
in DDP itself (``optimize --nproc-per-node N -- python train.py``), never the built-in
optimize, which trains in one process; and they set a DDP argument only where the script
did not pass it (``DdpArgumentRecipe``, ``SetDdpArgument``), so the script's own choice
always stands.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, ClassVar

from ..train_step import TrainStep
from .injection import Injection, ScriptProcess
from .recipe_contract import Context, Recipe
from .script_facts import DdpFacts, ScriptFacts

ONE_PROCESS = ("the built-in optimize trains in one process: no DistributedDataParallel to tune "
               "(optimize --nproc-per-node N -- python train.py tries it on a script)")
NO_DDP = "the script wraps no model in DistributedDataParallel: run it with --nproc-per-node N"
ONE_RANK = "the script's process group has one rank: no gradient crosses a process"


class DdpRecipe(Recipe):
    """A recipe on the script's ``DistributedDataParallel``: never one for a training state."""

    family = "distributed"

    def check(self, setup: TrainStep, ctx: Context) -> str | None:
        return ONE_PROCESS

    def apply(self, setup: TrainStep, ctx: Context) -> str:
        raise RuntimeError(f"{self.name}: {ONE_PROCESS}")


def no_ddp(facts: ScriptFacts) -> str | None:
    """Why no DDP recipe can act: the script built no ``DistributedDataParallel``."""
    return None if facts.ddp else NO_DDP


def one_rank(facts: ScriptFacts) -> str | None:
    """Why a recipe on the allreduce gains nothing: every DDP model's group has one rank."""
    return ONE_RANK if facts.ddp and all(m.world_size <= 1 for m in facts.ddp) else None


def unset(facts: ScriptFacts, argument: str) -> list[DdpFacts]:
    """The script's DDP models it built without passing ``argument``."""
    return [m for m in facts.ddp if getattr(m, argument) is None]


def passed_by_script(facts: ScriptFacts, argument: str) -> str:
    """The reason for a recipe whose argument the script passes to every DDP model itself."""
    values = ", ".join(dict.fromkeys(f"{argument}={getattr(m, argument)!r}" for m in facts.ddp))
    return f"the script passes {values} to DistributedDataParallel itself"


class DdpArgumentRecipe(DdpRecipe):
    """A DDP recipe that sets one ``DistributedDataParallel`` argument (``argument``) on the
    models the script built without it; ``multi_rank``: it acts on the allreduce, so a
    one-rank group has nothing to gain."""

    argument: ClassVar[str] = ""
    multi_rank: ClassVar[bool] = False

    def value(self, model: DdpFacts) -> Any:
        """The value to set on ``model``."""
        return True

    def describe(self, value: Any, model: DdpFacts) -> str:
        """What setting ``value`` on ``model`` did, in one line."""
        return f"DistributedDataParallel({self.argument}={value!r}) for {model.module_type}: {self.summary}"

    def why_not(self, candidates: list[DdpFacts]) -> str | None:
        """Why the recipe does not apply to the models built without the argument (None: it does)."""
        return None

    def script_check(self, facts: ScriptFacts, ctx: Context, accepted: Collection[str] = ()) -> str | None:
        reason = no_ddp(facts) or (one_rank(facts) if self.multi_rank else None)
        if reason:
            return reason
        candidates = unset(facts, self.argument)
        return self.why_not(candidates) if candidates else passed_by_script(facts, self.argument)

    def code_edit(self, facts: ScriptFacts) -> str | None:
        largest = max(unset(facts, self.argument), key=lambda m: m.gradient_bytes, default=DdpFacts("model"))
        return f"DistributedDataParallel(model, ..., {self.argument}={self.value(largest)!r})"

    def injection(self) -> Injection:
        return SetDdpArgument(self.name, self.argument, self.value, self.describe)


class SetDdpArgument(Injection):
    """Sets one ``DistributedDataParallel`` argument on each model built without it (one the
    script passed is left alone and nothing is said); ``value`` from the model's facts;
    ``describe``: what was done, from the value and the facts."""

    def __init__(self, recipe: str, argument: str, value: Callable[[DdpFacts], Any],
                 describe: Callable[[Any, DdpFacts], str]) -> None:
        self.recipe, self.argument, self.value, self.describe = recipe, argument, value, describe

    def ddp_arguments(self, process: ScriptProcess, arguments: dict[str, Any], facts: DdpFacts) -> None:
        if getattr(facts, self.argument) is not None:  # the script passed it (bucket_cap_mb_list counts)
            return
        value = self.value(facts)
        arguments[self.argument] = value
        process.said(self.recipe, self.describe(value, facts))


__all__ = ["DdpArgumentRecipe", "DdpRecipe", "NO_DDP", "ONE_PROCESS", "ONE_RANK", "SetDdpArgument", "no_ddp",
           "one_rank", "passed_by_script", "unset"]

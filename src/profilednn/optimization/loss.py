"""``fused_loss``: torchvision's sigmoid focal loss replaced by ProfileDNN's kernel (seed 000,
2.8 and appendix 5-7): a C kernel, vectorised for the CPU's ISA and threaded, that writes
the loss and its gradient in one pass over memory (see ``profilednn.kernels.focal_loss``).

The loss is found where detection code keeps it: the loss function itself, or an
attribute of the loss module or one of its submodules (``RetinaNetLoss.focal_loss``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from torch import nn

from ..extras import loaded_attribute
from ..kernels import sigmoid_focal_loss
from ..train_step import TrainStep
from .injection import Injection, ScriptProcess
from .recipe_contract import Context, Recipe
from .script_facts import ScriptFacts

def reference_focal_loss() -> Any:
    """torchvision's ``sigmoid_focal_loss`` when torchvision is loaded (no loss holds it
    otherwise), else a sentinel nothing else is."""
    return loaded_attribute("torchvision.ops.focal_loss", "sigmoid_focal_loss") or _NOT_LOADED


_NOT_LOADED = object()


def focal_loss_sites(loss_fn: Any) -> list[tuple[Any, str]]:
    """(object, attribute) pairs that hold torchvision's sigmoid_focal_loss."""
    reference = reference_focal_loss()
    owners = list(loss_fn.modules()) if isinstance(loss_fn, nn.Module) else [loss_fn]
    sites = []
    for owner in owners:
        for attr, value in list(getattr(owner, "__dict__", {}).items()):
            if value is reference:
                sites.append((owner, attr))
    return sites


class FusedLoss(Recipe):
    name = "fused_loss"
    family = "custom kernel"
    summary = ("torchvision's sigmoid focal loss -> profilednn.kernels.sigmoid_focal_loss (one fused "
               "vectorised pass for loss and gradient)")

    def check(self, setup: TrainStep, ctx: Context) -> str | None:
        if setup.loss_fn is reference_focal_loss() or focal_loss_sites(setup.loss_fn):
            return None
        return ("the loss does not call torchvision.ops.sigmoid_focal_loss (the loss with a "
                "fused kernel here)")

    def apply(self, setup: TrainStep, ctx: Context) -> str:
        if setup.loss_fn is reference_focal_loss():
            setup.loss_fn = sigmoid_focal_loss
            return "loss_fn = profilednn.kernels.sigmoid_focal_loss"
        sites = focal_loss_sites(setup.loss_fn)
        for owner, attr in sites:
            setattr(owner, attr, sigmoid_focal_loss)
        where = ", ".join(f"{type(o).__name__}.{a}" for o, a in sites)
        return f"{where} = profilednn.kernels.sigmoid_focal_loss"

    def script_check(self, facts: ScriptFacts, ctx: Context, accepted: Collection[str] = ()) -> str | None:
        if facts.focal_loss_calls == 0:
            return "the script does not call torchvision.ops.sigmoid_focal_loss (the loss with a fused kernel here)"
        return None

    def code_edit(self, facts: ScriptFacts) -> str | None:
        return "from profilednn.kernels import sigmoid_focal_loss  # instead of torchvision.ops'"

    def injection(self) -> Injection:
        return KernelFocalLoss()


class KernelFocalLoss(Injection):
    """torchvision's ``sigmoid_focal_loss`` calls the kernel: the injector swaps the function's
    code, so every reference the script holds (``from torchvision.ops import ...``) does."""

    def focal_loss(self, process: ScriptProcess) -> Callable[..., Any]:
        process.said(RECIPE.name, "torchvision.ops.sigmoid_focal_loss -> profilednn.kernels.sigmoid_focal_loss "
                     "(every reference the script holds)")
        return sigmoid_focal_loss


RECIPE = FusedLoss()

"""``fused_batchnorm``: training batch norm, and the ReLU or residual add + ReLU after it, in
fused C kernels (``profilednn.kernels.FusedBatchNorm2d``).

Once BF16 and channels_last make a ResNet's convolutions fast, the memory-bound rest of the
step remains: batch norm forward and backward, ReLU and its backward, the residual adds --
each a separate pass over an activation in stock PyTorch (on a 2-core Xeon with AMX, half of
ResNet-50's BF16 step). The fused kernels read and write what the arithmetic needs; where
``torch.fx`` can trace the model, ``relu(bn(x))`` and ``relu(bn(x) + r)`` become one call.
The batch statistics are summed in a fixed order and in double, so fp32 results agree with
stock to rounding (closer to an fp64 reference than stock's channels_last kernel).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from torch import nn

from ..kernels.batch_norm import native_available
from ..kernels.batch_norm_fusion import fuse_batch_norm
from ..train_step import TrainStep
from .injection import Injection, ScriptProcess
from .recipe_contract import Context, Recipe
from .script_facts import RootFacts, ScriptFacts, no_root


def trainable_batch_norms(model: nn.Module) -> int:
    """How many stock ``nn.BatchNorm2d`` the model holds (frozen ones are torchvision's
    ``FrozenBatchNorm2d``, another class)."""
    return sum(type(m) is nn.BatchNorm2d for m in model.modules())


class FusedBatchNorm(Recipe):
    name = "fused_batchnorm"
    family = "custom kernel"
    summary = ("nn.BatchNorm2d -> profilednn.kernels.FusedBatchNorm2d: batch norm with the ReLU or residual "
               "add + ReLU after it, two fused passes forward and two backward")

    def check(self, setup: TrainStep, ctx: Context) -> str | None:
        if setup.compiled:
            return "the model is already compiled: its batch norms are inside the compiled graph"
        if trainable_batch_norms(setup.model) == 0:
            return "the model has no nn.BatchNorm2d to fuse"
        if not native_available():
            return "the fused batch-norm kernel cannot be built here (no C compiler, or the build failed)"
        return None

    def apply(self, setup: TrainStep, ctx: Context) -> str:
        setup.model, summary = fuse_batch_norm(setup.model)
        return summary.describe()

    def script_check(self, facts: ScriptFacts, ctx: Context, accepted: Collection[str] = ()) -> str | None:
        if no_root(facts):
            return no_root(facts)
        if not any(r.batch_norms for r in facts.roots):
            return "the model has no nn.BatchNorm2d to fuse"
        if all(r.compiled for r in facts.roots if r.batch_norms):
            return "the script compiles its model: its batch norms are inside the compiled graph"
        if not native_available():
            return "the fused batch-norm kernel cannot be built here (no C compiler, or the build failed)"
        return None

    def code_edit(self, facts: ScriptFacts) -> str | None:
        return "model, _ = profilednn.kernels.fuse_batch_norm(model)"

    def injection(self) -> Injection:
        return FuseRootBatchNorms()


class FuseRootBatchNorms(Injection):
    """``fuse_batch_norm`` on each root with batch norms; a traced graph over the same
    parameters becomes the root's ``forward`` (the script's references stay valid)."""

    def inject_root(self, process: ScriptProcess, module: nn.Module, facts: RootFacts) -> None:
        if not facts.batch_norms:
            return
        fused, summary = fuse_batch_norm(module)
        if fused is not module:

            def forward(*args: Any, **kwargs: Any) -> Any:
                if fused.training != module.training:
                    fused.train(module.training)
                return fused(*args, **kwargs)

            module.forward = forward  # type: ignore[method-assign]
        process.said(RECIPE.name, summary.describe())


RECIPE = FusedBatchNorm()

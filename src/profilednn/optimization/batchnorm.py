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

from torch import nn

from ..kernels.batch_norm import native_available
from ..kernels.batch_norm_fusion import fuse_batch_norm
from ..train_step import TrainStep
from .recipe_contract import Context, Recipe, register


def trainable_batch_norms(model: nn.Module) -> int:
    """How many stock ``nn.BatchNorm2d`` the model holds (frozen ones are torchvision's
    ``FrozenBatchNorm2d``, another class)."""
    return sum(type(m) is nn.BatchNorm2d for m in model.modules())


@register
class FusedBatchNorm(Recipe):
    name = "fused_batchnorm"
    family = "custom kernel"
    summary = ("nn.BatchNorm2d -> profilednn.kernels.FusedBatchNorm2d: batch norm with the ReLU or residual "
               "add + ReLU after it, two fused passes forward and two backward")
    advice_rules = ("batchnorm_passes",)

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

"""``gemm_weight_grad``: 1x1 convolutions' weight gradients as one GEMM each
(``profilednn.kernels.gemm_weight_grads``).

A 1x1 convolution over channels_last activations is a matrix product, and so is its weight
gradient: ``dW = dY^T X`` over the activations as they lie in memory. oneDNN computes it as a
backward-by-weights convolution; on a 2-core Xeon with AMX that ran ResNet-50's 1x1 weight
gradients in BF16 at 220-1,050 GFLOP/s, a third of the rate of the same shapes' forwards,
where ``torch.mm`` of the same operands ran at 550-1,330 (``benchmarks/bench_weight_grad.py``).
The forward and the input gradient stay stock; where the activations are NCHW the weight
gradient stays stock too (a transpose would cost more than it saves), so the recipe needs
channels_last.
"""

from __future__ import annotations

from torch import nn

from ..kernels.conv_weight_grad import eligible, gemm_weight_grads
from ..train_step import TrainStep
from .recipe_contract import Context, Recipe, register


def trainable_pointwise_convolutions(model: nn.Module) -> int:
    """How many eligible 1x1 ``nn.Conv2d`` (see ``conv_weight_grad.eligible``) train their weight."""
    return sum(eligible(m) and m.weight.requires_grad for m in model.modules())


@register
class GemmWeightGrad(Recipe):
    name = "gemm_weight_grad"
    family = "gemm"
    summary = ("1x1 nn.Conv2d -> profilednn.kernels.GemmWeightGradConv2d: the weight gradient as one GEMM "
               "(dY^T X on channels_last activations) instead of oneDNN's backward-by-weights convolution")
    advice_rules = ("conv_weight_grad",)

    def check(self, setup: TrainStep, ctx: Context) -> str | None:
        if setup.compiled:
            return "the model is already compiled: its convolutions are inside the compiled graph"
        if trainable_pointwise_convolutions(setup.model) == 0:
            return "the model has no trainable 1x1 nn.Conv2d (no padding, dilation or groups) to take"
        if not setup.channels_last:
            return ("the activations are NCHW (channels_last not applied): the GEMM reads channels_last rows "
                    "in place, while NCHW ones would need a transpose first")
        return None

    def apply(self, setup: TrainStep, ctx: Context) -> str:
        setup.model, summary = gemm_weight_grads(setup.model)
        return summary.describe()

"""``pointwise_gemm``: 1x1 convolutions as GEMMs over channels_last rows, forward and
backward (``profilednn.kernels.pointwise_gemms``).

A 1x1 convolution over channels_last activations is a matrix product, and so are its
gradients: ``Y = X W^T``, ``dX = dY W``, ``dW = dY^T X`` over the activations as they lie in
memory. oneDNN computes them as convolution primitives; on a 2-core Xeon with AMX its
backward-by-weights primitive ran ResNet-50's 1x1 shapes in BF16 at 220-1,050 GFLOP/s, a third
of the rate of the same shapes' forwards, and ``torch.mm`` of the same operands beat all three
directions at most shapes (``benchmarks/bench_pointwise_conv.py``). Where the activations are
NCHW the convolutions stay stock (a transpose would cost more than it saves), so the recipe
needs channels_last.
"""

from __future__ import annotations

from collections.abc import Collection

from torch import nn

from ..kernels.pointwise_conv import eligible, pointwise_gemms
from ..recipe_catalogue import CHANNELS_LAST
from ..train_step import TrainStep
from .injection import Injection, ScriptProcess
from .recipe_contract import Context, Recipe
from .script_facts import RootFacts, ScriptFacts, no_root


def trainable_pointwise_convolutions(model: nn.Module) -> int:
    """How many eligible 1x1 ``nn.Conv2d`` (see ``conv_weight_grad.eligible``) train their weight."""
    return sum(eligible(m) and m.weight.requires_grad for m in model.modules())


class PointwiseGemm(Recipe):
    name = "pointwise_gemm"
    family = "gemm"
    summary = ("1x1 nn.Conv2d -> profilednn.kernels.PointwiseGemmConv2d: forward, input and weight gradients "
               "as GEMMs on channels_last rows instead of oneDNN's convolution primitives")

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
        setup.model, summary = pointwise_gemms(setup.model)
        return summary.describe()

    def script_check(self, facts: ScriptFacts, ctx: Context, accepted: Collection[str] = ()) -> str | None:
        if no_root(facts):
            return no_root(facts)
        roots = [r for r in facts.roots if r.pointwise_convolutions]
        if not roots:
            return "the model has no trainable 1x1 nn.Conv2d (no padding, dilation or groups) to take"
        if all(r.compiled for r in roots):
            return "the script compiles its model: its convolutions are inside the compiled graph"
        if CHANNELS_LAST not in accepted and not any(r.channels_last for r in roots):
            return ("the activations are NCHW (channels_last not accepted, nor the script's own): the GEMM reads "
                    "channels_last rows in place, while NCHW ones would need a transpose first")
        return None

    def code_edit(self, facts: ScriptFacts) -> str | None:
        return "profilednn.kernels.pointwise_gemms(model)  # on a channels_last model, before fuse_batch_norm"

    def injection(self) -> Injection:
        return PointwiseGemmRoots()


class PointwiseGemmRoots(Injection):
    """Each root's 1x1 convolutions swapped in place (before ``fuse_batch_norm``: its traced
    graph keeps them as calls)."""

    def inject_root(self, process: ScriptProcess, module: nn.Module, facts: RootFacts) -> None:
        if facts.pointwise_convolutions:
            _, summary = pointwise_gemms(module)  # in place: the script's references stay valid
            process.said(RECIPE.name, summary.describe())


RECIPE = PointwiseGemm()

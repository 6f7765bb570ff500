"""``fused_dropout``: dropout's mask drawn by a counter-based generator inside the pass that
applies it (``profilednn.kernels.FusedDropout``), regenerated for the backward.

In bert_base's optimized BF16 step on a 2-core Xeon with AMX, ``aten::bernoulli_`` (stock
dropout drawing its mask one number at a time from torch's global generator) took 403 ms of
1,656. The model's dropouts are ``nn.Dropout`` modules (after the embeddings, and three in
each ``nn.TransformerEncoderLayer``) plus one applied functionally inside
``nn.MultiheadAttention`` (on the attention probabilities, in
``F.scaled_dot_product_attention``'s math path): the recipe swaps the modules for
``FusedDropout`` and each attention for ``FusedDropoutAttention``, which computes the same
math path with the fused dropout on the probabilities. A dropout called as ``F.dropout``
inside a custom forward is not reached (the workload would call a module instead).

The masks are not stock's: ``random_stream = True`` sends the recipe through the
random-stream gate as well (``stream_gate.py``: with dropout on, every site is a dropout of
its p, its backward uses its mask, and the model trains as the arm does across dropout seeds).
"""

from __future__ import annotations

from ..kernels.dropout import native_available
from ..kernels.dropout_fusion import dropout_sites, fuse_dropout
from ..train_step import TrainStep
from .recipe_contract import Context, Recipe, register


@register
class FusedDropoutRecipe(Recipe):
    name = "fused_dropout"
    family = "custom kernel"
    summary = ("nn.Dropout -> profilednn.kernels.FusedDropout (and nn.MultiheadAttention's dropout on the "
               "attention probabilities): Philox mask drawn and applied in one pass, regenerated for the backward")
    random_stream = True
    advice_rules = ("dropout_masks",)

    def check(self, setup: TrainStep, ctx: Context) -> str | None:
        if setup.compiled:
            return "the model is already compiled: its dropouts are inside the compiled graph"
        sites = dropout_sites(setup.model)
        if sites.dropouts + sites.attentions == 0:
            if sites.attentions_left:
                return (f"the model's {sites.attentions_left} attention dropout(s) use separate k/v projections or "
                        "extra biases, which FusedDropoutAttention does not take, and it has no nn.Dropout with p > 0")
            return "the model has no dropout with p > 0 (no nn.Dropout module, no nn.MultiheadAttention dropout)"
        if not native_available():
            return "the fused dropout kernel cannot be built here (no C compiler, or the build failed)"
        return None

    def apply(self, setup: TrainStep, ctx: Context) -> str:
        return fuse_dropout(setup.model).describe()

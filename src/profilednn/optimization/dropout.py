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

from collections.abc import Collection
from typing import Any

from torch import nn

from ..kernels import attention
from ..kernels.dropout import FusedDropout, native_available
from ..kernels.dropout_fusion import dropout_sites, fuse_dropout
from ..train_step import TrainStep
from .injection import AttentionCall, Injection, ScriptProcess
from .recipe_contract import Context, Recipe
from .script_facts import RootFacts, ScriptFacts, no_root


class FusedDropoutRecipe(Recipe):
    name = "fused_dropout"
    family = "custom kernel"
    summary = ("nn.Dropout -> profilednn.kernels.FusedDropout (and nn.MultiheadAttention's dropout on the "
               "attention probabilities): Philox mask drawn and applied in one pass, regenerated for the backward")
    random_stream = True

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

    def script_check(self, facts: ScriptFacts, ctx: Context, accepted: Collection[str] = ()) -> str | None:
        if no_root(facts):
            return no_root(facts)
        roots = [r for r in facts.roots if r.dropouts]
        if not roots and not facts.attention_dropout_calls:
            left = sum(r.dropout_attentions_left for r in facts.roots)
            form = (f"; its {left} nn.MultiheadAttention dropout(s) use separate k/v projections or extra biases, "
                    "which FusedDropoutAttention does not take" if left else "")
            return ("the model has no nn.Dropout with p > 0, no nn.MultiheadAttention dropout and no "
                    "F.scaled_dot_product_attention call with dropout_p > 0 (a dropout called as F.dropout is not "
                    "swapped)" + form)
        if facts.roots and all(r.compiled for r in facts.roots):
            return "the script compiles its model: its dropouts are inside the compiled graph"
        if not native_available():
            return "the fused dropout kernel cannot be built here (no C compiler, or the build failed)"
        return None

    def code_edit(self, facts: ScriptFacts) -> str | None:
        modules = ("profilednn.kernels.fuse_dropout(model)  # in place: nn.Dropout -> FusedDropout, "
                   "nn.MultiheadAttention -> FusedDropoutAttention")
        sdpa = ("profilednn.kernels.scaled_dot_product_attention(q, k, v, ..., dropout_p=p) where the model calls "
                "F.scaled_dot_product_attention with dropout")
        if facts.attention_dropout_calls and not any(r.dropouts for r in facts.roots):
            return sdpa
        return f"{modules}; {sdpa}" if facts.attention_dropout_calls else modules

    def injection(self) -> Injection:
        return FusedDropoutSites()


class FusedDropoutSites(Injection):
    """Each root's dropouts swapped in place (before ``fuse_batch_norm``: its traced graph
    keeps them as calls), and the calls of ``F.scaled_dot_product_attention`` with dropout
    sent to ``profilednn.kernels.scaled_dot_product_attention``. With the option
    ``dropout_sites`` each fused site is observed for the random-stream gate."""

    def __init__(self) -> None:
        self.native = False  # whether the dropout kernel builds: asked at install, never in a trace
        self.parts: list[str] = []  # what it did, in the order it did it
        self.attention_dropout: FusedDropout | None = None  # the one the fused attention calls run

    def install(self, process: ScriptProcess) -> None:
        self.native = native_available()

    def _said(self, process: ScriptProcess, part: str) -> None:
        if part not in self.parts:
            self.parts.append(part)
            process.applied[RECIPE.name] = "; ".join(self.parts)

    def inject_root(self, process: ScriptProcess, module: nn.Module, facts: RootFacts) -> None:
        if not facts.dropouts or facts.compiled:
            return
        summary = fuse_dropout(module)  # in place: the script's references stay valid
        self._said(process, summary.describe())
        if process.options.get("dropout_sites"):
            for name, m in module.named_modules():
                if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0.0:
                    process.observe_site(name or type(m).__name__, m)

    def _attention_dropout(self, process: ScriptProcess) -> FusedDropout:
        if self.attention_dropout is None:
            self.attention_dropout = FusedDropout(0.5)
            if process.options.get("dropout_sites"):
                process.observe_site("scaled_dot_product_attention", self.attention_dropout)
        return self.attention_dropout

    def attention(self, process: ScriptProcess, compiling: bool, call: AttentionCall) -> Any:
        if not attention.applies(call.query, call.key, call.value, call.attn_mask, call.dropout_p, call.is_causal,
                                 call.enable_gqa, self.native):
            return NotImplemented
        args = (call.query, call.key, call.value, call.attn_mask, call.dropout_p, call.is_causal, call.scale)
        if compiling:  # traced: no bookkeeping; the fused path traces as math plus the opaque dropout op
            return attention.scaled_dot_product_attention(*args, native=True)
        self._said(process, "F.scaled_dot_product_attention with dropout_p > 0 -> "
                            "profilednn.kernels.scaled_dot_product_attention (probabilities' dropout fused)")
        return attention.scaled_dot_product_attention(*args, dropout=self._attention_dropout(process), native=True)


RECIPE = FusedDropoutRecipe()

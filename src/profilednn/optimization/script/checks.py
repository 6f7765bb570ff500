"""Which recipe applies to a script, from what its stock arm saw (``facts.py``), and the
code edit that does by hand what an accepted recipe injects.

The built-in recipes answer ``check(setup, ctx)`` on a ``TrainStep``; a script has no
setup, only the objects the stock arm met. Each answer here is the built-in one's on those
objects: the same reasons where the same facts decide (BF16 on a CPU without native BF16,
an optimizer already fused), and a recipe the script already uses (its own autocast,
``fused=True``, ``torch.compile``) is skipped with that reason. The process-level recipes
(threads, allocator) ask their own ``check``: they only read the launch environment.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from types import SimpleNamespace

from ..recipe_contract import Context, Recipe
from .facts import ScriptFacts
from .inject import INJECTABLE


def _no_root(facts: ScriptFacts) -> str | None:
    if not facts.roots:
        return "the script called no module with parameters before its first optimizer step"
    return None


def _frozen_weight_grads(facts: ScriptFacts, ctx: Context) -> str | None:
    if facts.unused_trainable == 0:
        return "every parameter that requires grad is updated by an optimizer: nothing is frozen by hand"
    return None


def _fused_loss(facts: ScriptFacts, ctx: Context) -> str | None:
    if facts.focal_loss_calls == 0:
        return "the script does not call torchvision.ops.sigmoid_focal_loss (the loss with a fused kernel here)"
    return None


def _fused_optimizer(facts: ScriptFacts, ctx: Context) -> str | None:
    if not facts.optimizers:
        return "the script created no torch.optim optimizer"
    if any(o.plan for o in facts.optimizers):
        return None
    return "; ".join(dict.fromkeys(o.why for o in facts.optimizers))


def _channels_last(facts: ScriptFacts, ctx: Context) -> str | None:
    convs = [r for r in facts.roots if r.conv2d]
    if not convs:
        return "the script's model has no 2-D convolution: the memory format does not matter"
    if not any(r.input_4d for r in convs):
        return "the model's inputs are not 4-D image tensors"
    if all(r.channels_last for r in convs):
        return "the script already keeps its model in channels_last"
    return None


def _dtype_policy(facts: ScriptFacts, ctx: Context) -> str | None:
    speed = ctx.dtype_speed("bf16")
    if not speed.faster:
        return f"BF16 does not pay on this CPU ({ctx.topology.model_name}): {speed.reason}; staying in fp32"
    own = [r.autocast for r in facts.roots if r.autocast]
    if own:
        return f"the script already runs its model under {own[0]} autocast"
    if not any(r.compute_layers for r in facts.roots):
        return "the model has no convolution, linear or recurrent layer to run in BF16"
    return None


def _fused_batchnorm(facts: ScriptFacts, ctx: Context) -> str | None:
    from ...kernels.batch_norm import native_available

    if not any(r.batch_norms for r in facts.roots):
        return "the model has no nn.BatchNorm2d to fuse"
    if all(r.compiled for r in facts.roots if r.batch_norms):
        return "the script compiles its model: its batch norms are inside the compiled graph"
    if not native_available():
        return "the fused batch-norm kernel cannot be built here (no C compiler, or the build failed)"
    return None


def _pointwise_gemm(facts: ScriptFacts, ctx: Context, accepted: Collection[str] = ()) -> str | None:
    roots = [r for r in facts.roots if r.pointwise_convolutions]
    if not roots:
        return "the model has no trainable 1x1 nn.Conv2d (no padding, dilation or groups) to take"
    if all(r.compiled for r in roots):
        return "the script compiles its model: its convolutions are inside the compiled graph"
    if "channels_last" not in accepted and not any(r.channels_last for r in roots):
        return ("the activations are NCHW (channels_last not accepted, nor the script's own): the GEMM reads "
                "channels_last rows in place, while NCHW ones would need a transpose first")
    return None


def _fused_dropout(facts: ScriptFacts, ctx: Context) -> str | None:
    from ...kernels.dropout import native_available

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


def _torch_compile(facts: ScriptFacts, ctx: Context) -> str | None:
    from ..compile import compiler_missing

    if any(r.compiled for r in facts.roots):
        return "the script already compiles its model (torch.compile)"
    return compiler_missing()


def _dataloader_workers(facts: ScriptFacts, ctx: Context) -> str | None:
    if not facts.loader_workers:
        return "no torch DataLoader feeds the step"
    if all(w > 0 for w in facts.loader_workers):
        return f"the script's DataLoader already has workers ({', '.join(map(str, facts.loader_workers))})"
    return None


_CHECKS = {
    "frozen_weight_grads": _frozen_weight_grads,
    "fused_loss": _fused_loss,
    "fused_optimizer": _fused_optimizer,
    "channels_last": _channels_last,
    "dtype_policy": _dtype_policy,
    "fused_batchnorm": _fused_batchnorm,
    "pointwise_gemm": _pointwise_gemm,
    "fused_dropout": _fused_dropout,
    "torch_compile": _torch_compile,
    "dataloader_workers": _dataloader_workers,
}
_NEEDS_ROOT = ("frozen_weight_grads", "channels_last", "dtype_policy", "fused_batchnorm", "pointwise_gemm",
               "fused_dropout", "torch_compile")


def script_check(recipe: Recipe, facts: ScriptFacts, ctx: Context, env: dict[str, str],
                 accepted: Collection[str] = ()) -> str | None:
    """Why ``recipe`` does not apply to the script (None: it does). ``env``: the launch
    environment accepted so far; ``accepted``: the injected recipes accepted so far."""
    if recipe.fresh_process:
        return recipe.check(SimpleNamespace(env=dict(env)), ctx)  # type: ignore[arg-type]  # reads .env only
    if recipe.name == "frozen_batchnorm":
        return ("not injected into a script: folding FrozenBatchNorm2d into its convolutions rebuilds the "
                "model; the Python API (profilednn.optimize) does it")
    if recipe.name not in INJECTABLE:
        return f"{recipe.name} cannot be injected into a script (no injection is known for it)"
    if recipe.name in _NEEDS_ROOT and _no_root(facts):
        return _no_root(facts)
    if recipe.name == "pointwise_gemm":
        return _pointwise_gemm(facts, ctx, accepted)
    return _CHECKS[recipe.name](facts, ctx)


def _fused_dropout_edit(facts: ScriptFacts) -> str:
    modules = ("profilednn.kernels.fuse_dropout(model)  # in place: nn.Dropout -> FusedDropout, "
               "nn.MultiheadAttention -> FusedDropoutAttention")
    attention = ("profilednn.kernels.scaled_dot_product_attention(q, k, v, ..., dropout_p=p) where the model calls "
                 "F.scaled_dot_product_attention with dropout")
    if facts.attention_dropout_calls and not any(r.dropouts for r in facts.roots):
        return attention
    return f"{modules}; {attention}" if facts.attention_dropout_calls else modules


def code_edit(recipe: str, facts: ScriptFacts) -> str | None:
    """The edit to the script that does what the accepted ``recipe`` injects (None for the
    process-level recipes: their edit is the launch prefix)."""
    if recipe == "fused_optimizer":
        edits = []
        for o in facts.optimizers:
            if o.plan == "fused":
                edits.append(f"torch.optim.{o.cls}(..., fused=True)")
            elif o.plan == "foreach":
                edits.append(f"torch.optim.{o.cls}(..., foreach=True)")
            elif o.plan == "fused_lamb":
                edits.append(f"profilednn.kernels.FusedLAMB(params, lr=..., betas=..., eps=..., weight_decay=...) "
                             f"instead of {o.cls}")
        return "; ".join(dict.fromkeys(edits)) or None
    if recipe == "fused_dropout":
        return _fused_dropout_edit(facts)
    return {
        "dtype_policy": ("with torch.autocast('cpu', dtype=torch.bfloat16): out = model(x)  "
                         "# then out = out.float() before the loss"),
        "channels_last": ("model = model.to(memory_format=torch.channels_last); "
                          "x = x.contiguous(memory_format=torch.channels_last)"),
        "torch_compile": "model = torch.compile(model)",
        "fused_batchnorm": "model, _ = profilednn.kernels.fuse_batch_norm(model)",
        "pointwise_gemm": ("profilednn.kernels.pointwise_gemms(model)  # on a channels_last model, "
                             "before fuse_batch_norm"),
        "frozen_weight_grads": "p.requires_grad_(False) for every parameter no optimizer updates",
        "fused_loss": "from profilednn.kernels import sigmoid_focal_loss  # instead of torchvision.ops'",
        "dataloader_workers": "DataLoader(..., num_workers=1, persistent_workers=True)",
    }.get(recipe)


# The order the edits are made in, the injector's: the model's layout, then the modules swapped
# in place, fuse_batch_norm (its traced graph keeps the swapped modules as calls), compile last.
EDIT_ORDER = ("frozen_weight_grads", "fused_optimizer", "channels_last", "dtype_policy", "pointwise_gemm",
              "fused_dropout", "fused_batchnorm", "fused_loss", "torch_compile", "dataloader_workers")


def code_edits(recipes: Iterable[str], facts: ScriptFacts) -> list[str]:
    """The edits for the accepted ``recipes``, in the order they are to be made (``EDIT_ORDER``),
    whatever order the search accepted them in."""
    ordered = sorted(recipes, key=lambda r: EDIT_ORDER.index(r) if r in EDIT_ORDER else len(EDIT_ORDER))
    return [e for e in (code_edit(r, facts) for r in ordered) if e]


__all__ = ["EDIT_ORDER", "code_edit", "code_edits", "script_check"]

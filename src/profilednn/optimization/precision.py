"""``dtype_policy``: BF16 autocast where BF16 pays on the CPU, loss kept in fp32 (seed 000, 2.6).

BF16 pays where the machine profile measured its GEMM above fp32's (2.2x with avx512_bf16 on
a Zen 4) or, unmeasured, with an AMX matrix unit (6.3x on the Intel AMX guest); without
avx512_bf16/AMX oneDNN emulates it (ResNet-50 training ran 16x slower than fp32 on an AVX2
EPYC). The loss and
its reductions stay fp32: the seed traced a wrong focal loss to BF16 casting under
autocast, so the model's floating outputs are cast back to fp32 before the loss.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import torch
from torch import nn

from ..train_step import TrainStep, floating_to_fp32
from .injection import Injection, ScriptProcess
from .recipe_contract import BF16_TOLERANCE, Context, Recipe
from .script_facts import RootFacts, ScriptFacts, no_root

_COMPUTE_LAYERS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear, nn.MultiheadAttention, nn.LSTM, nn.GRU)


def has_compute_layers(model: nn.Module) -> bool:
    """Whether ``model`` holds a convolution, linear or recurrent layer (what BF16 speeds up)."""
    return any(isinstance(m, _COMPUTE_LAYERS) for m in model.modules())


NOT_NATIVE = "no native bf16"  # in dtype_policy's reason when the CPU lacks avx512_bf16/AMX


class DtypePolicy(Recipe):
    name = "dtype_policy"
    family = "precision"
    summary = "BF16 autocast for the model on CPUs where BF16 pays; loss and reductions in fp32"
    tolerance = BF16_TOLERANCE
    precision = "bf16"

    def check(self, setup: TrainStep, ctx: Context) -> str | None:
        speed = ctx.dtype_speed("bf16")
        if not speed.faster:
            return f"BF16 does not pay on this CPU ({ctx.topology.model_name}): {speed.reason}; staying in fp32"
        if setup.autocast_dtype is not None:
            return f"already under {setup.autocast_dtype} autocast"
        if not has_compute_layers(setup.model):
            return "the model has no convolution, linear or recurrent layer to run in BF16"
        return None

    def apply(self, setup: TrainStep, ctx: Context) -> str:
        setup.autocast_dtype = torch.bfloat16
        return ("torch.autocast('cpu', dtype=torch.bfloat16) around the forward; outputs cast to "
                "fp32 before the loss; weights, optimizer state and loss stay fp32")

    def script_check(self, facts: ScriptFacts, ctx: Context, accepted: Collection[str] = ()) -> str | None:
        if no_root(facts):
            return no_root(facts)
        speed = ctx.dtype_speed("bf16")
        if not speed.faster:
            return f"BF16 does not pay on this CPU ({ctx.topology.model_name}): {speed.reason}; staying in fp32"
        own = [r.autocast for r in facts.roots if r.autocast]
        if own:
            return f"the script already runs its model under {own[0]} autocast"
        if not any(r.compute_layers for r in facts.roots):
            return "the model has no convolution, linear or recurrent layer to run in BF16"
        return None

    def code_edit(self, facts: ScriptFacts) -> str | None:
        return ("with torch.autocast('cpu', dtype=torch.bfloat16): out = model(x)  "
                "# then out = out.float() before the loss")

    def injection(self) -> Injection:
        return Bf16Autocast()


class Bf16Autocast(Injection):
    """Each call of a root under ``torch.autocast('cpu', bfloat16)``, its floating outputs cast
    back to fp32: the loss stays fp32."""

    def inject_root(self, process: ScriptProcess, module: nn.Module, facts: RootFacts) -> None:
        process.said(RECIPE.name, "torch.autocast('cpu', dtype=torch.bfloat16) around each call of "
                     f"{type(module).__name__}; floating outputs cast to fp32 before the loss")

    def enter_root_call(self) -> Callable[[Any], Any]:
        autocast = torch.autocast("cpu", dtype=torch.bfloat16)
        autocast.__enter__()

        def leave(output: Any) -> Any:
            autocast.__exit__(None, None, None)
            return floating_to_fp32(output)

        return leave


RECIPE = DtypePolicy()

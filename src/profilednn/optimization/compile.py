"""``torch_compile``: the model through ``torch.compile`` (TorchInductor generates fused C++
kernels for the elementwise chains between convolutions and GEMMs, forward and backward).

Compilation takes a while (tens of seconds to minutes on a CPU): it happens in the first
steps, which the A/B test excludes from the timing and reports separately. It is kept
only where it wins.
"""

from __future__ import annotations

import shutil
import sys

import torch

from ..train_step import TrainStep
from .recipe_contract import Context, Recipe, register


def compiler_missing() -> str | None:
    """Why torch.compile cannot run here, or None."""
    if not hasattr(torch, "compile"):
        return "this torch has no torch.compile"
    try:
        import torch._dynamo as dynamo
    except ImportError as exc:
        return f"torch._dynamo cannot be imported: {exc}"
    if sys.version_info >= (3, 15):
        return f"torch.compile does not support Python {sys.version_info.major}.{sys.version_info.minor} yet"
    if not any(shutil.which(cc) for cc in ("g++", "c++", "clang++")):
        return "no C++ compiler (g++/clang++) on PATH: TorchInductor cannot build CPU kernels"
    del dynamo
    return None


@register
class TorchCompile(Recipe):
    name = "torch_compile"
    family = "compiler"
    summary = "torch.compile(model): generated fused kernels for the elementwise work, forward and backward"
    advice_rules = ("fragmentation",)

    def check(self, setup: TrainStep, ctx: Context) -> str | None:
        if setup.compiled:
            return "the model is already compiled"
        return compiler_missing()

    def apply(self, setup: TrainStep, ctx: Context) -> str:
        mode = ctx.options.get("compile_mode") or None
        setup.model = torch.compile(setup.model, mode=mode)
        setup.compiled = True
        return f"model = torch.compile(model{', mode=' + repr(mode) if mode else ''}) (TorchInductor, C++ CPU kernels)"

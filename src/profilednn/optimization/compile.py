"""``torch_compile``: the model through ``torch.compile`` (TorchInductor generates fused C++
kernels for the elementwise chains between convolutions and GEMMs, forward and backward).

Max pools are swapped for ``AtenMaxPool2d`` first: Inductor lowers the max-pool backward to a
scatter that ran ResNet-50's stem pool 3-4x slower than ATen's channels_last kernel, enough
to cancel what compiling the rest won (``profilednn.kernels.aten_pool``).

Compilation takes a while (tens of seconds to minutes on a CPU): it happens in the first
steps, which the A/B test excludes from the timing and reports separately. It is kept
only where it wins.
"""

from __future__ import annotations

import shutil
import sys

import torch

from ..kernels.aten_pool import keep_aten_pools
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
    compiled_random = True  # Inductor's generated code draws dropout masks from its own generator

    def check(self, setup: TrainStep, ctx: Context) -> str | None:
        if setup.compiled:
            return "the model is already compiled"
        return compiler_missing()

    def apply(self, setup: TrainStep, ctx: Context) -> str:
        mode = ctx.options.get("compile_mode") or None
        pools = keep_aten_pools(setup.model)
        setup.model = torch.compile(setup.model, mode=mode)
        setup.compiled = True
        return (f"model = torch.compile(model{', mode=' + repr(mode) if mode else ''}) (TorchInductor, C++ CPU kernels)"
                + pools_note(pools))


def pools_note(pools: list[str]) -> str:
    """What ``keep_aten_pools`` did, for the recipe's line ("" when the model has no max pool)."""
    if not pools:
        return ""
    return (f"; {len(pools)} nn.MaxPool2d kept on ATen's kernels (profilednn.kernels.AtenMaxPool2d: Inductor's "
            "max-pool backward is a scatter, several times slower)")

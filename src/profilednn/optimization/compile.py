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
from collections.abc import Collection

import torch
from torch import nn

from ..kernels.aten_pool import keep_aten_pools
from ..train_step import TrainStep
from .injection import Injection, ScriptProcess
from .recipe_contract import Context, Recipe
from .script_facts import RootFacts, ScriptFacts, no_root


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


class TorchCompile(Recipe):
    name = "torch_compile"
    family = "compiler"
    summary = "torch.compile(model): generated fused kernels for the elementwise work, forward and backward"
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

    def script_check(self, facts: ScriptFacts, ctx: Context, accepted: Collection[str] = ()) -> str | None:
        if no_root(facts):
            return no_root(facts)
        if any(r.compiled for r in facts.roots):
            return "the script already compiles its model (torch.compile)"
        return compiler_missing()

    def code_edit(self, facts: ScriptFacts) -> str | None:
        return "model = torch.compile(model)"

    def injection(self) -> Injection:
        return CompileRoots()


class CompileRoots(Injection):
    """Each root's ``forward`` through ``torch.compile`` (its first call runs eager), its max
    pools kept on ATen's kernels first. The option ``eager_random`` makes the compiled code
    draw its random numbers with eager PyTorch's kernels (``fallback_random``)."""

    def __init__(self) -> None:
        self.pools: list[str] = []  # what keep_aten_pools did to the root being discovered

    def prepare_root(self, process: ScriptProcess, module: nn.Module, facts: RootFacts) -> None:
        if not facts.compiled:
            self.pools = keep_aten_pools(module)  # before fuse_batch_norm: its traced graph keeps them as calls

    def inject_root(self, process: ScriptProcess, module: nn.Module, facts: RootFacts) -> None:
        if facts.compiled:
            return
        mode = process.options.get("compile_mode") or None
        if process.options.get("eager_random"):
            import torch._inductor.config as inductor_config

            inductor_config.fallback_random = True
        module.forward = torch.compile(module.forward, mode=mode)  # type: ignore[method-assign]
        process.said(RECIPE.name, f"{type(module).__name__}.forward = torch.compile(...)"
                     + (f" (mode={mode!r})" if mode else "") + "; the first call runs eager" + pools_note(self.pools))


def pools_note(pools: list[str]) -> str:
    """What ``keep_aten_pools`` did, for the recipe's line ("" when the model has no max pool)."""
    if not pools:
        return ""
    return (f"; {len(pools)} nn.MaxPool2d kept on ATen's kernels (profilednn.kernels.AtenMaxPool2d: Inductor's "
            "max-pool backward is a scatter, several times slower)")


RECIPE = TorchCompile()

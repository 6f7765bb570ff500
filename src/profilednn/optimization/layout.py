"""``channels_last``: NHWC activations and weights end to end (seed 000, 2.4).

With NCHW tensors oneDNN reorders activations into its blocked layout around every
convolution; with channels_last it reads and writes NHWC directly, and the native
batch-norm / pooling kernels have NHWC paths too.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import torch
from torch import nn

from ..train_step import TrainStep
from .injection import Injection, ScriptProcess
from .recipe_contract import Context, Recipe
from .script_facts import RootFacts, ScriptFacts, no_root


def conv2d_count(model: nn.Module) -> int:
    return sum(isinstance(m, nn.Conv2d) for m in model.modules())


def is_channels_last(model: nn.Module) -> bool:
    """Whether every 4-D parameter is already stored channels_last."""
    four_d = [p for p in model.parameters() if p.dim() == 4]
    return bool(four_d) and all(p.is_contiguous(memory_format=torch.channels_last) for p in four_d)


class ChannelsLast(Recipe):
    name = "channels_last"
    family = "layout"
    summary = "model and 4-D inputs in channels_last (NHWC): no activation reorders around convolutions"

    def check(self, setup: TrainStep, ctx: Context) -> str | None:
        convs = conv2d_count(setup.model)
        if convs == 0:
            return "the model has no 2-D convolution: the memory format does not matter"
        inputs = setup.sample_inputs()
        if not (isinstance(inputs, torch.Tensor) and inputs.dim() == 4):
            return "the inputs are not 4-D image tensors"
        if setup.channels_last and is_channels_last(setup.model):
            return "already channels_last (model and inputs)"
        return None

    def apply(self, setup: TrainStep, ctx: Context) -> str:
        setup.model.to(memory_format=torch.channels_last)  # same Parameter objects: the optimizer keeps them
        setup.channels_last = True
        return (f"model.to(memory_format=torch.channels_last) ({conv2d_count(setup.model)} convolutions); "
                "inputs converted each step")

    def script_check(self, facts: ScriptFacts, ctx: Context, accepted: Collection[str] = ()) -> str | None:
        if no_root(facts):
            return no_root(facts)
        convs = [r for r in facts.roots if r.conv2d]
        if not convs:
            return "the script's model has no 2-D convolution: the memory format does not matter"
        if not any(r.input_4d for r in convs):
            return "the model's inputs are not 4-D image tensors"
        if all(r.channels_last for r in convs):
            return "the script already keeps its model in channels_last"
        return None

    def code_edit(self, facts: ScriptFacts) -> str | None:
        return ("model = model.to(memory_format=torch.channels_last) (before DistributedDataParallel(model), "
                "if the script wraps it); x = x.contiguous(memory_format=torch.channels_last)")

    def injection(self) -> Injection:
        return ChannelsLastRoots()


class ChannelsLastRoots(Injection):
    """Each root's weights in channels_last at its first call, its 4-D floating inputs on every call."""

    def inject_root(self, process: ScriptProcess, module: nn.Module, facts: RootFacts) -> None:
        module.to(memory_format=torch.channels_last)  # same Parameter objects: optimizers keep them
        process.said(RECIPE.name, f"{type(module).__name__}.to(memory_format=torch.channels_last) "
                     f"({facts.conv2d} convolutions); 4-D inputs converted on each call")

    def ddp_arguments(self, process: ScriptProcess, arguments: dict[str, Any], facts: Any) -> None:
        """Before ``DistributedDataParallel`` is built: its module to channels_last first, so
        that DDP's gradient buckets take the channels_last strides (converted after, every
        gradient is copied across layouts into its bucket: the reducer's stride warning)."""
        module = arguments.get("module")
        if isinstance(module, nn.Module):
            module.to(memory_format=torch.channels_last)

    def root_args(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(a.contiguous(memory_format=torch.channels_last)
                     if isinstance(a, torch.Tensor) and a.dim() == 4 and a.is_floating_point() else a
                     for a in args)


RECIPE = ChannelsLast()

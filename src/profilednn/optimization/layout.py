"""``channels_last``: NHWC activations and weights end to end (seed 000, 2.4).

With NCHW tensors oneDNN reorders activations into its blocked layout around every
convolution; with channels_last it reads and writes NHWC directly, and the native
batch-norm / pooling kernels have NHWC paths too.
"""

from __future__ import annotations

import torch
from torch import nn

from ..train_step import TrainStep
from .recipe_contract import Context, Recipe, register


def conv2d_count(model: nn.Module) -> int:
    return sum(isinstance(m, nn.Conv2d) for m in model.modules())


def is_channels_last(model: nn.Module) -> bool:
    """Whether every 4-D parameter is already stored channels_last."""
    four_d = [p for p in model.parameters() if p.dim() == 4]
    return bool(four_d) and all(p.is_contiguous(memory_format=torch.channels_last) for p in four_d)


@register
class ChannelsLast(Recipe):
    name = "channels_last"
    family = "layout"
    summary = "model and 4-D inputs in channels_last (NHWC): no activation reorders around convolutions"
    advice_rules = ("channels_last",)

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

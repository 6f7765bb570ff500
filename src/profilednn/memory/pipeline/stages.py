"""Stages of a pipeline: which devices, which model as a flat sequence of layers, and how
the layers are cut.

A model is pipelined as an ``nn.Sequential`` of layers with names that point back to the
original modules (so per-layer times from a profiled Run can be matched): an
``nn.Sequential`` as is, ``small_cnn`` as its feature layers + pool + flatten + classifier,
torchvision ResNets as stem + every residual block + pool + flatten + fc.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import nn

from ...errors import InputError
from ...extras import has_optional
from ..training import resolve_device


def parse_stages(text: str) -> list[torch.device]:
    """``"cuda:0,cpu"`` -> devices, each checked to exist (InputError naming a missing one)."""
    names = [part.strip() for part in str(text).split(",") if part.strip()]
    if len(names) < 2:
        raise InputError(f"--stages needs at least two devices separated by commas (e.g. cpu,cpu), not {text!r}")
    return [resolve_device(name) for name in names]


@dataclass
class LayerSequence:
    """A model as a sequence of layers; ``names[i]`` is the original module path of layer i
    (``"(flatten)"`` for a flatten the conversion inserted)."""

    model: nn.Sequential
    names: list[str]

    def __len__(self) -> int:
        return len(self.names)


def _is_torchvision_resnet(model: nn.Module) -> bool:
    """Only where torchvision (the [zoo] extra) is installed can a model be its ResNet."""
    if not has_optional("torchvision"):
        return False
    from torchvision.models.resnet import ResNet

    return isinstance(model, ResNet)


def as_layer_sequence(model: nn.Module) -> LayerSequence:
    """The model as a flat ``nn.Sequential``, sharing its modules (no copy)."""
    from ...workloads.small import SmallCNN

    layers: list[tuple[str, nn.Module]] = []
    if isinstance(model, nn.Sequential):
        layers = [(name, child) for name, child in model.named_children()]
    elif isinstance(model, SmallCNN):
        layers = [(f"features.{n}", c) for n, c in model.features.named_children()]
        layers += [("pool", model.pool), ("(flatten)", nn.Flatten(1)), ("classifier", model.classifier)]
    elif _is_torchvision_resnet(model):
        layers = [(n, getattr(model, n)) for n in ("conv1", "bn1", "relu", "maxpool")]
        for stage in ("layer1", "layer2", "layer3", "layer4"):
            layers += [(f"{stage}.{n}", c) for n, c in getattr(model, stage).named_children()]
        layers += [("avgpool", model.avgpool), ("(flatten)", nn.Flatten(1)), ("fc", model.fc)]
    else:
        raise InputError(f"cannot pipeline a {type(model).__name__}: give an nn.Sequential, small_cnn "
                         "or a torchvision ResNet (digits_mlp, small_cnn, resnet50, resnext50_32x4d)")
    seq = nn.Sequential(OrderedDict((str(i), m) for i, (_, m) in enumerate(layers)))
    return LayerSequence(model=seq, names=[n for n, _ in layers])


def split_layers(seq: nn.Sequential, balance: list[int]) -> list[nn.Sequential]:
    """Cut ``seq`` into consecutive stages of ``balance[i]`` layers each."""
    if any(b < 1 for b in balance) or sum(balance) != len(seq):
        raise InputError(f"balance {balance} must give every stage >= 1 layer and sum to {len(seq)} layers")
    out, start = [], 0
    for count in balance:
        out.append(nn.Sequential(*[seq[i] for i in range(start, start + count)]))
        start += count
    return out


def parse_balance(text: str | None, n_stages: int) -> list[int] | None:
    """``"5,3"`` -> [5, 3]; None stays None (the balancer decides)."""
    if text is None:
        return None
    try:
        balance = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError as exc:
        raise InputError(f"--balance must be integers separated by commas, not {text!r}") from exc
    if len(balance) != n_stages:
        raise InputError(f"--balance has {len(balance)} entries but there are {n_stages} stages")
    return balance


__all__ = ["LayerSequence", "as_layer_sequence", "parse_balance", "parse_stages", "split_layers"]

"""Torchvision image classifiers, random weights: ``resnet50``, ``resnext50_32x4d``, ``alexnet``.

Cross-entropy loss and SGD (momentum 0.9, weight decay 1e-4), as in the torchvision
ImageNet reference recipe. The ``lr`` knob is the rate at batch 256 (0.1 in the recipe);
the optimizer uses it scaled linearly to the batch (the linear scaling rule), so small
profiling batches train stably instead of diverging.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..errors import WorkloadError
from ..extras import import_optional
from ..train_step import TrainStep
from .base import WorkloadSpec, finish_workload
from .data import image_classification_batch, make_pool

_KNOBS = ("batch_size", "image_size", "num_classes", "lr")

SPECS = (
    WorkloadSpec(
        name="resnet50",
        description="torchvision ResNet-50, random weights, ImageNet-shaped classification",
        family="vision",
        item="images",
        defaults={"batch_size": 16, "image_size": 224, "num_classes": 1000, "lr": 0.1},
        knobs=_KNOBS,
        min_image_size=32,  # total stride 32: below it every stage collapses to 1x1
    ),
    WorkloadSpec(
        name="resnext50_32x4d",
        description="torchvision ResNeXt-50 32x4d, random weights (RetinaNet's backbone)",
        family="vision",
        item="images",
        defaults={"batch_size": 16, "image_size": 224, "num_classes": 1000, "lr": 0.1},
        knobs=_KNOBS,
        min_image_size=32,
    ),
    WorkloadSpec(
        name="alexnet",
        description="torchvision AlexNet, random weights (large fully-connected layers)",
        family="vision",
        item="images",
        defaults={"batch_size": 32, "image_size": 224, "num_classes": 1000, "lr": 0.1},
        knobs=_KNOBS,
        min_image_size=63,  # smallest input whose last max-pool still has a 1x1 output
    ),
)


def constructor(name: str) -> Callable[..., nn.Module]:
    """torchvision's constructor for classifier ``name``; torchvision is the ``[zoo]``
    extra, imported here so that the rest of ProfileDNN works without it."""
    models = import_optional("torchvision.models", needed_for=f"workload {name!r}")
    return getattr(models, name)


def check_shapes_on_meta(
    name: str, make_model: Callable[[], nn.Module], input_shape: tuple[int, ...]
) -> None:
    """Run one forward pass on the meta device (no memory, no arithmetic, no RNG draws)
    and turn a shape failure into a WorkloadError, before the real model is built.

    This catches what a minimum image size alone cannot, e.g. batch_size 1 with a 1x1
    feature map, where training-mode batch norm has a single value per channel.
    """
    with torch.device("meta"):
        model = make_model().train()
        try:
            model(torch.empty(input_shape))
        except (RuntimeError, ValueError) as exc:
            first_line = str(exc).strip().splitlines()[0]
            raise WorkloadError(
                f"{name} cannot train on inputs of shape {list(input_shape)}: {first_line}; "
                "use a larger image_size or batch_size"
            ) from exc


def build(config: dict[str, Any]) -> TrainStep:
    """Build one of the torchvision classifiers from a resolved config (torch already seeded)."""
    name = config["name"]
    make = constructor(name)
    batch_size, image_size = config["batch_size"], config["image_size"]
    num_classes = config["num_classes"]

    def make_model() -> nn.Module:
        return make(weights=None, num_classes=num_classes)

    config["lr_effective"] = config["lr"] * batch_size / 256
    # The meta-device check draws nothing from torch's RNG, so the seed still decides the weights.
    check_shapes_on_meta(name, make_model, (batch_size, 3, image_size, image_size))
    model = make_model()
    batches = make_pool(
        lambda g: image_classification_batch(g, batch_size, image_size, num_classes), config["seed"]
    )
    return finish_workload(
        name,
        model,
        nn.CrossEntropyLoss(),
        lambda m: torch.optim.SGD(m.parameters(), lr=config["lr_effective"], momentum=0.9,
                                  weight_decay=1e-4),
        config,
        batches,
    )

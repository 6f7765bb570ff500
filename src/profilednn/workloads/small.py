"""``small_cnn``: a tiny image classifier for tests and quick demos.

Three conv -> batchnorm -> relu -> maxpool blocks (32, 64, 128 channels), a global
average pool and one linear layer; 32x32 images, 10 classes by default.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..train_step import TrainStep
from .base import WorkloadSpec, finish_workload
from .data import image_classification_batch, make_pool

SPEC = WorkloadSpec(
    name="small_cnn",
    description="Tiny CNN (3 conv+bn+relu+pool blocks, linear); for tests and quick demos",
    family="vision",
    item="images",
    defaults={"batch_size": 32, "image_size": 32, "num_classes": 10, "lr": 0.01},
    knobs=("batch_size", "image_size", "num_classes", "lr"),
    min_image_size=8,  # three 2x2 pools: 8 -> 4 -> 2 -> 1
)


class SmallCNN(nn.Module):
    def __init__(self, num_classes: int, widths: tuple[int, ...] = (32, 64, 128)) -> None:
        super().__init__()
        blocks: list[nn.Module] = []
        in_channels = 3
        for width in widths:
            blocks += [
                nn.Conv2d(in_channels, width, kernel_size=3, padding=1, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(2),
            ]
            in_channels = width
        self.features = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(in_channels, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:  # [B, 3, H, W] -> [B, classes]
        x = self.features(images)
        x = self.pool(x).flatten(1)
        return self.classifier(x)


def build(config: dict[str, Any]) -> TrainStep:
    """Build ``small_cnn`` from a resolved config (the caller has seeded torch)."""
    model = SmallCNN(config["num_classes"])
    batches = make_pool(
        lambda g: image_classification_batch(
            g, config["batch_size"], config["image_size"], config["num_classes"]
        ),
        config["seed"],
    )
    return finish_workload(
        SPEC.name,
        model,
        nn.CrossEntropyLoss(),
        lambda m: torch.optim.SGD(m.parameters(), lr=config["lr"], momentum=0.9, weight_decay=1e-4),
        config,
        batches,
    )

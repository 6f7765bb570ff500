"""``retinanet_resnext50_fpn``: the seed paper's case study (RetinaNet with a ResNeXt-50 backbone).

Built from torchvision pieces the way the MLPerf reference builds it, except that the
loss is a separate phase: the model returns dense per-anchor outputs and
``RetinaNetLoss`` turns them into a scalar, so a profile can tell the two apart.

    images [B, 3, S, S]
      -> ResNeXt-50 32x4d body (FrozenBatchNorm2d; conv1 and layer1 frozen)
      -> FPN over layer2..layer4 + P6/P7      (P3..P7, 256 channels, strides 8..128)
      -> RetinaNetHead (classification and box-regression subnets, 9 anchors per location)
      -> cls_logits [B, A, num_classes], bbox_regression [B, A, 4]
    loss = sigmoid focal loss (alpha 0.25, gamma 2, sum / positives) + L1 box loss on positives

A is the total number of anchors: 9 per location summed over P3..P7, e.g. 120,087 at
800x800. There is no GeneralizedRCNNTransform (resize, normalise, pad) and no anchor
matching: the synthetic images are already normalised and the targets already matched
(see ``data.detection_batch``). The default image size is 512 (MLPerf trains at 800 on
OpenImages); pass image_size=800 for the paper's shapes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from ..extras import import_optional
from ..recipe_catalogue import FROZEN_BATCHNORM
from ..train_step import TrainStep
from .base import WorkloadSpec, finish_workload
from .data import POOL_BATCHES, detection_batch, make_pool

ANCHORS_PER_LOCATION = 9  # 3 scales x 3 aspect ratios
PYRAMID_STRIDES = (8, 16, 32, 64, 128)  # P3..P7
FPN_CHANNELS = 256
TARGET_POOL_BYTES = 512 * 2**20  # the dense one-hot targets are big: cap the data pool

SPEC = WorkloadSpec(
    name="retinanet_resnext50_fpn",
    description=(
        "RetinaNet on a ResNeXt-50 32x4d FPN (FrozenBatchNorm, conv1+layer1 frozen), focal loss "
        "as its own phase; num_classes 91 is COCO-like, 264 OpenImages-like; image 512 "
        "(MLPerf: 800)"
    ),
    family="detection",
    item="images",
    defaults={
        "batch_size": 2,
        "image_size": 512,
        "num_classes": 91,
        "trainable_layers": 3,
        "positive_fraction": 0.002,
        "lr": 0.01,
    },
    knobs=(
        "batch_size",
        "image_size",
        "num_classes",
        "trainable_layers",
        "positive_fraction",
        "lr",
    ),
    min_image_size=32,
    ranges={"trainable_layers": (0, 5), "positive_fraction": (None, 1.0)},
)


def anchor_count(image_size: int, anchors_per_location: int = ANCHORS_PER_LOCATION) -> int:
    """Total anchors A for a square image: every stride-2 layer of the backbone (and the
    P6/P7 convolutions) maps a side n to ceil(n / 2), so level Pk has side ceil(S / 2**k)."""
    sides = [math.ceil(image_size / stride) for stride in PYRAMID_STRIDES]
    return anchors_per_location * sum(side * side for side in sides)


class RetinaNetDense(nn.Module):
    """RetinaNet up to its dense outputs: backbone + FPN, then the two subnets."""

    def __init__(self, num_classes: int, trainable_layers: int = 3) -> None:
        super().__init__()
        # torchvision is the [zoo] extra: imported here, so the module imports without it.
        import_optional("torchvision", needed_for=f"workload {SPEC.name!r}")
        from torchvision.models.detection.backbone_utils import resnet_fpn_backbone
        from torchvision.models.detection.retinanet import RetinaNetHead
        from torchvision.ops.feature_pyramid_network import LastLevelP6P7
        from torchvision.ops.misc import FrozenBatchNorm2d

        # ResNeXt-50 32x4d with FrozenBatchNorm2d; keeps the layer2..layer4 outputs (C3..C5),
        # adds P6/P7 from P5, and freezes all but the last `trainable_layers` of
        # (layer4, layer3, layer2, layer1, conv1).
        self.backbone = resnet_fpn_backbone(
            backbone_name="resnext50_32x4d",
            weights=None,
            norm_layer=FrozenBatchNorm2d,
            trainable_layers=trainable_layers,
            returned_layers=[2, 3, 4],
            extra_blocks=LastLevelP6P7(FPN_CHANNELS, FPN_CHANNELS),
        )
        self.head = RetinaNetHead(FPN_CHANNELS, ANCHORS_PER_LOCATION, num_classes)

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        features = list(self.backbone(images).values())  # P3..P7, each [B, 256, H_k, W_k]
        return self.head(features)  # {"cls_logits": [B, A, C], "bbox_regression": [B, A, 4]}


class RetinaNetLoss(nn.Module):
    """Focal loss on every anchor and class, plus L1 box loss on the positive anchors,
    both divided by the number of positive anchors in the batch.

    ``focal_loss`` is the swappable part: any callable with torchvision's signature
    ``focal_loss(logits, one_hot_targets, alpha=, gamma=, reduction="sum")``, e.g. a
    custom kernel with an explicit backward. None means torchvision's
    ``sigmoid_focal_loss`` (the ``[zoo]`` extra).
    """

    def __init__(
        self,
        focal_loss: Callable[..., torch.Tensor] | None = None,
        alpha: float = 0.25,
        gamma: float = 2.0,
    ) -> None:
        super().__init__()
        if focal_loss is None:
            ops = import_optional("torchvision.ops", needed_for=f"workload {SPEC.name!r}")
            focal_loss = ops.sigmoid_focal_loss
        self.focal_loss = focal_loss
        self.alpha = alpha
        self.gamma = gamma

    def forward(
        self, outputs: dict[str, torch.Tensor], targets: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        positive = targets["positive"]
        num_positive = positive.sum().clamp(min=1)
        classification = self.focal_loss(
            outputs["cls_logits"],
            targets["cls_targets"],
            alpha=self.alpha,
            gamma=self.gamma,
            reduction="sum",
        )
        box_regression = F.l1_loss(
            outputs["bbox_regression"][positive], targets["box_targets"][positive], reduction="sum"
        )
        return (classification + box_regression) / num_positive


def build(config: dict[str, Any]) -> TrainStep:
    """Build the RetinaNet workload from a resolved config (torch already seeded)."""
    batch_size, image_size = config["batch_size"], config["image_size"]
    num_classes = config["num_classes"]
    num_anchors = anchor_count(image_size)
    config["anchors"] = num_anchors
    config["positive_anchors_per_image"] = max(1, round(num_anchors * config["positive_fraction"]))
    config[FROZEN_BATCHNORM] = True  # the recipe that acts on its frozen batch norms

    model = RetinaNetDense(num_classes, config["trainable_layers"])
    target_bytes = batch_size * num_anchors * (num_classes + 4) * 4
    pool_batches = max(1, min(POOL_BATCHES, TARGET_POOL_BYTES // target_bytes))
    batches = make_pool(
        lambda g: detection_batch(
            g, batch_size, image_size, num_classes, num_anchors, config["positive_fraction"]
        ),
        config["seed"],
        batches=pool_batches,
    )
    return finish_workload(
        SPEC.name,
        model,
        RetinaNetLoss(),
        lambda m: torch.optim.SGD(
            [p for p in m.parameters() if p.requires_grad],  # not the frozen layers
            lr=config["lr"],
            momentum=0.9,
            weight_decay=1e-4,
        ),
        config,
        batches,
    )

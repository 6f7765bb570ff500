"""Built-in training workloads: random weights, seeded synthetic data, nothing downloaded.

    from profilednn.workloads import build_workload
    workload = build_workload("resnet50", batch_size=2, image_size=64)
    loss = workload.run().loss   # workload is the one training state, a TrainStep

Each family lives in its own module and reads top to bottom: ``small`` (small_cnn),
``vision`` (torchvision classifiers), ``detection`` (RetinaNet-ResNeXt50-FPN with the
focal loss as a separate phase), ``transformer`` (BERT-base MLM), ``recurrent`` (LSTM LM);
``data`` makes the synthetic batches and ``zoo`` is the registry.
"""

from __future__ import annotations

from .base import COMMON_KNOBS, TokenCrossEntropy, WorkloadSpec
from .detection import RetinaNetDense, RetinaNetLoss, anchor_count
from .zoo import build_workload, get_spec, list_workloads

__all__ = [
    "COMMON_KNOBS",
    "RetinaNetDense",
    "RetinaNetLoss",
    "TokenCrossEntropy",
    "WorkloadSpec",
    "anchor_count",
    "build_workload",
    "get_spec",
    "list_workloads",
]

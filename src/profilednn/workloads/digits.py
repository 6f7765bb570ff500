"""scikit-learn's handwritten digits (shipped inside scikit-learn, no download) as tensors.

A real small task for studies that need accuracy, not just speed: convergence vs global
batch (distributed), and the asynchronous pipeline's accuracy (memory). 1,797 8x8 images,
10 classes; pixels scaled to [0, 1]; a fixed, seeded, stratified train/test split.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..extras import import_optional


@dataclass(frozen=True)
class DigitsData:
    """Train and test tensors: ``x`` float32 [N, 64] in [0, 1], ``y`` int64 [N]."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor

    @property
    def num_features(self) -> int:
        return int(self.x_train.shape[1])

    @property
    def num_classes(self) -> int:
        return 10


def load_digits_data(test_fraction: float = 0.25, seed: int = 0) -> DigitsData:
    """The digits split into train and test, stratified by class and seeded."""
    # scikit-learn is the [zoo] extra: a missing one is a one-line MissingExtraError.
    load_digits = import_optional("sklearn.datasets", "the digits data").load_digits
    from sklearn.model_selection import train_test_split

    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), not {test_fraction}")
    bunch = load_digits()
    x = torch.tensor(bunch.data, dtype=torch.float32) / 16.0
    y = torch.tensor(bunch.target, dtype=torch.int64)
    idx = torch.arange(len(y)).numpy()
    train_idx, test_idx = train_test_split(idx, test_size=test_fraction, random_state=seed,
                                           stratify=bunch.target)
    return DigitsData(x[train_idx], y[train_idx], x[test_idx], y[test_idx])


def digits_mlp(hidden: tuple[int, ...] = (128, 64), seed: int = 0) -> nn.Sequential:
    """A small MLP for the digits (64 -> hidden... -> 10), seeded; sequential so it can be split."""
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        layers: list[nn.Module] = []
        width = 64
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, 10))
        return nn.Sequential(*layers)
    finally:
        torch.random.set_rng_state(gen_state)


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Top-1 accuracy of ``model`` on ``(x, y)``, in [0, 1]."""
    was_training = model.training
    model.eval()
    try:
        return float((model(x).argmax(dim=1) == y).float().mean())
    finally:
        model.train(was_training)


__all__ = ["DigitsData", "accuracy", "digits_mlp", "load_digits_data"]

"""Custom kernels with explicit backward passes, written on stock PyTorch ops.

``sigmoid_focal_loss`` is seed 000's custom focal-loss kernel (sections 2.8, appendix 5-7):
torchvision's signature and values, an explicit backward, and far fewer passes over memory.
"""

from __future__ import annotations

from .focal_loss import release_gradient_buffers, sigmoid_focal_loss

__all__ = ["release_gradient_buffers", "sigmoid_focal_loss"]

"""Hand-written kernels, for the work stock PyTorch does in many passes over memory.

- ``sigmoid_focal_loss`` (``focal_loss.py``, ``focal_loss.c``): seed 000's custom focal-loss
  kernel (sections 2.8, appendix 5-7): torchvision's signature and values, an explicit
  backward, and far fewer passes over memory.
- ``FusedLAMB`` (``lamb.py``, ``lamb.c``): LAMB as one fused kernel (seed 000, 2.7: a fused
  LAMB cut parameter-update time 5.5x), checked against the per-parameter ``ReferenceLAMB``.
- ``FusedBatchNorm2d`` / ``fuse_batch_norm`` (``batch_norm.py``, ``batch_norm.c``,
  ``batch_norm_fusion.py``): training batch norm with the ReLU or residual add + ReLU after
  it, two fused passes forward and two backward (stock runs each as its own pass).
- ``FusedDropout`` / ``fuse_dropout`` (``dropout.py``, ``dropout.c``, ``dropout_fusion.py``):
  dropout whose Philox mask is drawn and applied in one pass and regenerated for the
  backward (stock draws it with ``bernoulli_`` and stores it), also inside
  ``nn.MultiheadAttention`` (``FusedDropoutAttention``).
- ``PointwiseGemmConv2d`` / ``pointwise_gemms`` (``pointwise_conv.py``): 1x1
  convolutions as GEMMs over the channels_last activations (forward ``X W^T``, input and
  weight gradients ``dY W``, ``dY^T X``) instead of oneDNN's convolution primitives.
- ``scaled_dot_product_attention`` (``attention.py``): ``F.scaled_dot_product_attention``
  whose dropout on the attention probabilities runs ``FusedDropout`` (CPU math path).
- ``AtenMaxPool2d`` / ``keep_aten_pools`` (``aten_pool.py``): max pooling kept on ATen's
  kernels inside ``torch.compile`` (Inductor's max-pool backward is a slower scatter).
- ``tag_compile_cache`` (``compile_cache.py``): ``torch.compile``'s cache keys include a
  digest of these ops' sources, so an upgrade never reuses a compiled backward of old formulas.
- ``build.py``: the C build system (compile once per machine, load with ctypes); it imports
  no PyTorch, so the verbose parser builds its line scanner with it too.

The exports load lazily: importing ``profilednn.kernels.build`` pulls in no PyTorch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr

if TYPE_CHECKING:
    from .batch_norm import FusedBatchNorm2d
    from .aten_pool import AtenMaxPool2d, keep_aten_pools
    from .batch_norm_fusion import fuse_batch_norm
    from .compile_cache import tag_compile_cache
    from .pointwise_conv import PointwiseGemmConv2d, pointwise_gemms
    from .dropout import FusedDropout, fused_dropout
    from .dropout_fusion import FusedDropoutAttention, fuse_dropout
    from .attention import scaled_dot_product_attention
    from .focal_loss import release_gradient_buffers, sigmoid_focal_loss
    from .lamb import FusedLAMB, ReferenceLAMB

_LAZY = {
    "AtenMaxPool2d": ".aten_pool",
    "keep_aten_pools": ".aten_pool",
    "FusedBatchNorm2d": ".batch_norm",
    "fuse_batch_norm": ".batch_norm_fusion",
    "tag_compile_cache": ".compile_cache",
    "PointwiseGemmConv2d": ".pointwise_conv",
    "pointwise_gemms": ".pointwise_conv",
    "FusedDropout": ".dropout",
    "fused_dropout": ".dropout",
    "FusedDropoutAttention": ".dropout_fusion",
    "fuse_dropout": ".dropout_fusion",
    "scaled_dot_product_attention": ".attention",
    "release_gradient_buffers": ".focal_loss",
    "sigmoid_focal_loss": ".focal_loss",
    "FusedLAMB": ".lamb",
    "ReferenceLAMB": ".lamb",
}

__getattr__ = lazy_getattr(__name__, _LAZY)

__all__ = ["AtenMaxPool2d", "FusedBatchNorm2d", "FusedDropout", "FusedDropoutAttention", "FusedLAMB",
           "PointwiseGemmConv2d", "ReferenceLAMB", "fuse_batch_norm", "fuse_dropout", "fused_dropout",
           "pointwise_gemms", "keep_aten_pools", "release_gradient_buffers", "scaled_dot_product_attention",
           "sigmoid_focal_loss", "tag_compile_cache"]

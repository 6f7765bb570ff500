"""A module of another class over the same tensors: how the kernels' modules replace a
stock one (``FusedBatchNorm2d.from_batch_norm``, ``PointwiseGemmConv2d.from_conv``) without
copying a parameter, so an optimizer built on the model keeps training them."""

from __future__ import annotations

from typing import TypeVar

from torch import nn

M = TypeVar("M", bound=nn.Module)


def sharing_tensors(cls: type[M], module: nn.Module) -> M:
    """An instance of ``cls`` with ``module``'s attributes and its very parameter, buffer
    and submodule dictionaries (no ``__init__`` of ``cls`` runs; the caller sets any
    attribute of its own)."""
    new = cls.__new__(cls)
    nn.Module.__init__(new)
    new.__dict__.update({k: v for k, v in module.__dict__.items()
                         if k not in ("_parameters", "_buffers", "_modules")})
    new._parameters = module._parameters
    new._buffers = module._buffers
    new._modules = module._modules
    return new


__all__ = ["sharing_tensors"]

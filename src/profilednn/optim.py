"""Deprecated import path: ``FusedLAMB`` and ``ReferenceLAMB`` live in ``profilednn.kernels``
(with the focal loss and the C build system). ``from profilednn.optim import FusedLAMB``
keeps working, with a ``DeprecationWarning``; use ``from profilednn.kernels import FusedLAMB``."""

from __future__ import annotations

import warnings

from .kernels.lamb import FusedLAMB, ReferenceLAMB

warnings.warn("profilednn.optim is deprecated: import FusedLAMB and ReferenceLAMB from profilednn.kernels",
              DeprecationWarning, stacklevel=2)

__all__ = ["FusedLAMB", "ReferenceLAMB"]

"""Projection: how fast could a Run's step go on this machine, and on another.

Seed 000 (section 2.3): replay each unique primitive alone, weight by its call count,
and compare with what the step measured (the efficiency ratio); add a roofline from the
machine's measured peaks, what-ifs (threads, another machine, BF16, a faster driver),
and seed 001's default-versus-optimized engine comparison.
"""

from __future__ import annotations

from .._lazy import lazy_getattr
from ..hardware.machine import MachineProfile, Measurement, get_machine, load_machine_file

# The replay machinery imports torch and the capture package: loaded on first use.
_LAZY = {
    "Projection": "profilednn.projection.projector",
    "project": "profilednn.projection.projector",
    "load_projection": "profilednn.projection.projector",
    "WhatIf": "profilednn.projection.what_if",
    "whatif": "profilednn.projection.what_if",
    "EngineComparison": "profilednn.projection.engines",
    "compare_engines": "profilednn.projection.engines",
}


__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = [
    "EngineComparison",
    "MachineProfile",
    "Measurement",
    "Projection",
    "WhatIf",
    "compare_engines",
    "get_machine",
    "load_machine_file",
    "load_projection",
    "project",
    "whatif",
]

"""The projection job's Python API: what ``profilednn machine`` / ``project`` / ``engines``
call, and what ``profilednn`` exports (``project``, ``get_machine``).

Names load on first use: the machine profile is light, the replay imports torch.
"""

from __future__ import annotations

from .._lazy import lazy_getattr

_WHERE = {  # module: the names it contributes (the machine profile lives below, in hardware/)
    "profilednn.hardware.machine": ("get_machine", "load_machine_file", "cached_machine_path"),
    "profilednn.hardware.drift": ("checked_machine", "probe_history"),
    ".projector": ("project", "load_projection"), ".what_if": ("require_faster_dtype", "whatif"),
    ".validate": ("validate",), ".engines": ("compare_engines",),
}
_API = {name: module for module, names in _WHERE.items() for name in names}
__getattr__ = lazy_getattr("profilednn.projection", _API)

__all__ = sorted(_API)

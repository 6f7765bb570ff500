"""The memory job's Python API: what ``profilednn memory`` / ``pipeline`` call, and what
``profilednn`` exports. Names load on first use (most import torch)."""

from __future__ import annotations

from .._lazy import lazy_getattr

_WHERE = {  # module: the names it contributes
    ".runs": ("memory_run",), ".tradeoff": ("memory_tradeoff",), ".budget": ("fit_batch_to_budget",),
    ".offload": ("offload_activations",), ".units": ("parse_bytes", "format_bytes"),
    ".pipeline.runner": ("train_pipeline",), ".pipeline.schedules": ("SCHEDULES",),
    ".pipeline.stages": ("parse_stages", "parse_balance"),
}
_API = {name: module for module, names in _WHERE.items() for name in names}
__getattr__ = lazy_getattr("profilednn.memory", _API)

__all__ = sorted(_API)

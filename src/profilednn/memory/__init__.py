"""The memory job: what training keeps in memory and ways to need less of it (seed 002).

- ``footprint``: per layer parameters, gradients, optimizer state, saved activations
  (predicted from layer types and shapes; measured with ``saved_tensors_hooks``),
  workspace; the step's predicted vs measured peak.
- ``budget``: the largest batch that fits a memory budget, predicted then confirmed.
- ``offload``: ``offload_activations``, saved activations to host memory with side-stream
  copies and prefetch; ``checkpointing``: recompute policies; ``tradeoff``: the table of
  memory vs step time for none / offload / checkpoint / both.
- ``pipeline``: layers split into stages on devices, GPipe / 1F1B / asynchronous
  (PipeDream weight stashing, weight averaging) schedules, a balancer.

Names load on first use, so importing ``profilednn.memory.report`` for a Run's HTML
report pulls in nothing else.
"""

from __future__ import annotations

from .._lazy import lazy_getattr

_LAZY = {
    "offload_activations": "profilednn.memory.offload",
    "ActivationOffloader": "profilednn.memory.offload",
    "OffloadStats": "profilednn.memory.offload",
    "apply_checkpointing": "profilednn.memory.checkpointing",
    "measure_footprint": "profilednn.memory.footprint",
    "predict_peak_bytes": "profilednn.memory.footprint",
    "Footprint": "profilednn.memory.footprint",
    "SavedTensorCounter": "profilednn.memory.activations",
    "predict_saved_activations": "profilednn.memory.activations",
    "measure_step_peak": "profilednn.memory.peak",
    "fit_batch_to_budget": "profilednn.memory.budget",
    "BudgetResult": "profilednn.memory.budget",
    "memory_tradeoff": "profilednn.memory.tradeoff",
    "memory_run": "profilednn.memory.runs",
    "build_on_device": "profilednn.memory.training",
    "parse_bytes": "profilednn.memory.units",
    "format_bytes": "profilednn.memory.units",
    "PipelineTrainer": "profilednn.memory.pipeline.schedules",
    "train_pipeline": "profilednn.memory.pipeline.runner",
    "balance_layers": "profilednn.memory.pipeline.balancer",
}


__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = sorted(_LAZY)

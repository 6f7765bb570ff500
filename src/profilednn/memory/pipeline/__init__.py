"""Pipeline training across devices: ``stages`` (layers and cuts), ``balancer`` (which
layers where), ``schedules`` (GPipe, 1F1B, asynchronous with weight stashing, in one
process), ``multiprocess`` (GPipe/1F1B over CPU processes on torch.distributed.pipelining),
``runner`` (a named model end to end)."""

from __future__ import annotations

from .balancer import Balance, balance_layers, layer_times_from_run, measure_layer_times
from .runner import PipelineResult, train_pipeline
from .schedules import SCHEDULES, PipelineTrainer, ScheduleResult, stage_ops
from .stages import LayerSequence, as_layer_sequence, parse_stages, split_layers

__all__ = [
    "Balance",
    "LayerSequence",
    "PipelineResult",
    "PipelineTrainer",
    "SCHEDULES",
    "ScheduleResult",
    "as_layer_sequence",
    "balance_layers",
    "layer_times_from_run",
    "measure_layer_times",
    "parse_stages",
    "split_layers",
    "stage_ops",
    "train_pipeline",
]

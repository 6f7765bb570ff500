"""Assign consecutive layers to pipeline stages: minimise the slowest stage's time, keep
every stage within its memory.

Inputs per layer: forward+backward time (from a profiled Run's ``layers`` table, or
measured here by ``measure_layer_times``) and memory (weights, gradients, optimizer
state, plus the activations the stage keeps for the micro-batches it has in flight).
Stages may differ in speed (``speeds``: relative throughput, e.g. a GPU stage 10x a CPU
stage) and memory (``memory_caps``). Exact dynamic programme over contiguous cuts,
O(stages x layers^2).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl
import torch
from torch import nn

from ...errors import InputError


@dataclass
class Balance:
    """``counts[s]`` layers on stage s; the predicted time and memory of each stage."""

    counts: list[int]
    stage_times: list[float]
    stage_memory: list[int]

    @property
    def bottleneck(self) -> float:
        return max(self.stage_times)


def balance_layers(
    times: Sequence[float],
    n_stages: int,
    memory: Sequence[int] | None = None,
    memory_caps: Sequence[int | None] | None = None,
    speeds: Sequence[float] | None = None,
) -> Balance:
    """The cut of ``len(times)`` layers into ``n_stages`` minimising the slowest stage."""
    n = len(times)
    if n_stages < 1 or n < n_stages:
        raise InputError(f"cannot cut {n} layers into {n_stages} stages (each stage needs a layer)")
    mem = list(memory) if memory is not None else [0] * n
    caps = list(memory_caps) if memory_caps is not None else [None] * n_stages
    speed = list(speeds) if speeds is not None else [1.0] * n_stages
    if len(mem) != n or len(caps) != n_stages or len(speed) != n_stages:
        raise InputError("balance_layers: memory must have one entry per layer, caps and speeds one per stage")
    t_prefix = [0.0]
    m_prefix = [0]
    for t, m in zip(times, mem):
        t_prefix.append(t_prefix[-1] + float(t))
        m_prefix.append(m_prefix[-1] + int(m))
    inf = float("inf")
    # best[s][j]: min bottleneck placing the first j layers on stages 0..s-1.
    best = [[inf] * (n + 1) for _ in range(n_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(n_stages + 1)]
    best[0][0] = 0.0
    for s in range(1, n_stages + 1):
        for j in range(s, n - (n_stages - s) + 1):
            for i in range(s - 1, j):
                if best[s - 1][i] == inf:
                    continue
                cap = caps[s - 1]
                if cap is not None and m_prefix[j] - m_prefix[i] > cap:
                    continue
                cost = max(best[s - 1][i], (t_prefix[j] - t_prefix[i]) / speed[s - 1])
                if cost < best[s][j]:
                    best[s][j], cut[s][j] = cost, i
    if best[n_stages][n] == inf:
        raise InputError(f"no cut of {n} layers into {n_stages} stages fits the stage memory caps "
                         f"({', '.join('-' if c is None else str(c) for c in caps)} bytes)")
    bounds = [n]
    for s in range(n_stages, 0, -1):
        bounds.append(cut[s][bounds[-1]])
    bounds.reverse()
    counts = [bounds[k + 1] - bounds[k] for k in range(n_stages)]
    stage_times = [(t_prefix[bounds[k + 1]] - t_prefix[bounds[k]]) / speed[k] for k in range(n_stages)]
    stage_memory = [m_prefix[bounds[k + 1]] - m_prefix[bounds[k]] for k in range(n_stages)]
    return Balance(counts=counts, stage_times=stage_times, stage_memory=stage_memory)


def measure_layer_times(seq: nn.Sequential, sample: torch.Tensor, repeats: int = 3) -> list[float]:
    """Forward+backward milliseconds of each layer on its own input (median of ``repeats``);
    the layers' state (batch-norm statistics) is restored afterwards."""
    saved_state = {k: v.clone() for k, v in seq.state_dict().items()}
    try:
        return _layer_times(seq, sample, repeats)
    finally:
        seq.load_state_dict(saved_state)


def _layer_times(seq: nn.Sequential, sample: torch.Tensor, repeats: int) -> list[float]:
    x = sample
    out: list[float] = []
    for layer in seq:
        x_in = x.detach().requires_grad_(x.is_floating_point())
        samples = []
        for _ in range(max(1, repeats) + 1):
            t0 = time.perf_counter()
            y = layer(x_in.clone())  # a non-leaf input: in-place layers (ReLU) may write it
            if y.requires_grad:
                y.backward(torch.ones_like(y))
            samples.append((time.perf_counter() - t0) * 1000.0)
        for p in layer.parameters():
            p.grad = None
        out.append(statistics.median(samples[1:]))
        with torch.no_grad():
            x = layer(x_in.detach().clone())
    return out


def layer_times_from_run(layers: pl.DataFrame, names: Sequence[str]) -> list[float]:
    """Mean forward+backward ms per step of each named module, from a Run's ``layers``
    table (a module's own rows when present, else the sum of its descendants' rows)."""
    steps = max(1, layers["step"].n_unique()) if "step" in layers.columns else 1
    per = layers.filter(pl.col("phase").is_in(["forward", "backward"])).group_by("module").agg(
        pl.col("time_ms").sum())
    total = dict(per.iter_rows())
    out = []
    for name in names:
        if name in total:
            out.append(total[name] / steps)
        else:
            out.append(sum(v for k, v in total.items() if k.startswith(name + ".")) / steps)
    if not any(out):
        raise InputError("the Run's layers table has no time for any of the pipelined layers "
                         f"({', '.join(names[:4])}, ...)")
    return out


def layer_memory(seq: nn.Sequential, sample: torch.Tensor, state_factor: float = 3.0) -> list[tuple[int, int]]:
    """Per layer: (weights + gradients + optimizer state bytes, saved activation bytes per
    micro-batch of ``sample``'s size), the latter predicted from shapes."""
    from ..activations import predict_saved_activations

    prediction = predict_saved_activations(seq, sample)
    out = []
    for i, layer in enumerate(seq):
        params = sum(p.numel() * p.element_size() for p in layer.parameters())
        saved = sum(b for name, b in prediction.by_module.items() if name == str(i) or name.startswith(f"{i}."))
        out.append((int(params * state_factor), int(saved)))
    return out


__all__ = ["Balance", "balance_layers", "layer_memory", "layer_times_from_run", "measure_layer_times"]

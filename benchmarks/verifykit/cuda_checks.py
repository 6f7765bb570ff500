"""Seed 002's rows, which need a CUDA GPU: the footprint prediction against the
allocator's own peak, activation offload against ``torch.autograd.graph.save_on_cpu``,
the CPU/GPU pipeline against the GPU alone and the CPU alone, and a GPU step's profile."""

from __future__ import annotations

import statistics
import tempfile
from typing import Any

from .host import Host
from .rows import Row

PART = "CUDA"
FOOTPRINT_PCT = 15.0
OFFLOAD_CUT, OFFLOAD_SLOWDOWN = 0.50, 0.10  # issue 44's targets for seed 002's offloading
GPU = "cuda:0"
# (model, knobs, quick knobs): ResNet-50 as seed 002 trains it; the quick shapes check the wiring
GPU_CASE = ("resnet50", {"batch_size": 64, "image_size": 224}, {"batch_size": 8, "image_size": 64})


def _case(quick: bool) -> tuple[str, dict[str, Any]]:
    name, knobs, quick_knobs = GPU_CASE
    return name, quick_knobs if quick else knobs


def footprint_gpu(host: Host, quick: bool) -> list[Row]:
    """Predicted training peak vs ``torch.cuda.max_memory_allocated`` over the same step."""
    from profilednn.memory.footprint import measure_footprint
    from profilednn.memory.training import build_on_device
    from profilednn.memory.units import format_bytes

    name, knobs = _case(quick)
    s = measure_footprint(build_on_device(name, device=GPU, **knobs)).summary
    pred, meas = s["predicted_peak_bytes"], s["accelerator_peak_bytes"] or s["measured_peak_bytes"]
    err = pred / meas - 1.0 if meas else None
    return [Row.judged(PART, "footprint_gpu", f"predicted peak within {FOOTPRINT_PCT:.0f}% of "
                       "torch.cuda.max_memory_allocated", err is not None and abs(err) * 100 <= FOOTPRINT_PCT,
                       f"{format_bytes(pred)} predicted vs {format_bytes(meas)} measured ({100 * (err or 0):+.1f}%); "
                       f"saved activations {format_bytes(s['saved_predicted_bytes'])} predicted vs "
                       f"{format_bytes(s['saved_measured_bytes'])}", err, reason=f"{name} {knobs}")]


def _save_on_cpu_arm(name: str, knobs: dict[str, Any], steps: int) -> tuple[int, float]:
    """Peak bytes and median step ms with stock ``save_on_cpu`` (pinned host memory on CUDA)."""
    import torch

    from profilednn.memory.training import build_on_device, timed_steps

    state = build_on_device(name, device=GPU, **knobs)
    pin = torch.cuda.is_available()
    ctx = lambda: torch.autograd.graph.save_on_cpu(pin_memory=pin)  # noqa: E731
    timed_steps(state, 1, ctx)  # warm-up
    reset_peak()
    times = timed_steps(state, steps, ctx)
    return peak_bytes(), statistics.median(times)


def reset_peak() -> None:
    import torch

    torch.cuda.reset_peak_memory_stats()


def peak_bytes() -> int:
    """``torch.cuda.max_memory_allocated`` since the last :func:`reset_peak`."""
    import torch

    return int(torch.cuda.max_memory_allocated())


def offload_gpu(host: Host, quick: bool) -> list[Row]:
    """none vs ProfileDNN's offload vs stock save_on_cpu, one process, the same model."""
    from profilednn.memory.tradeoff import memory_tradeoff
    from profilednn.memory.units import format_bytes

    name, knobs = _case(quick)
    steps = 3 if quick else 5
    df = memory_tradeoff(name, device=GPU, configs=("none", "offload"), steps=steps, **knobs)
    by = {r["config"]: r for r in df.iter_rows(named=True)}
    none, off = by["none"], by["offload"]
    stock_peak, stock_ms = _save_on_cpu_arm(name, knobs, steps)
    cut, slow = 1 - off["peak_vs_none"], off["slowdown_vs_none"] - 1
    stock = (f"save_on_cpu: peak {format_bytes(stock_peak)} ({1 - stock_peak / none['peak_bytes']:.0%} cut), "
             f"{stock_ms:.1f} ms ({stock_ms / none['step_ms'] - 1:+.0%})")
    return [
        Row.judged(PART, "offload_gpu", f"offload cuts the training peak by >= {OFFLOAD_CUT:.0%}", cut >= OFFLOAD_CUT,
                   f"{format_bytes(none['peak_bytes'])} -> {format_bytes(off['peak_bytes'])} ({cut:.0%} cut); {stock}",
                   cut, reason=f"{name} {knobs}"),
        Row.judged(PART, "offload_gpu", f"offload slows the step by <= {OFFLOAD_SLOWDOWN:.0%}", slow <= OFFLOAD_SLOWDOWN,
                   f"{none['step_ms']:.1f} -> {off['step_ms']:.1f} ms ({slow:+.0%}); {stock}", slow,
                   reason=f"{name} {knobs}"),
    ]


def _items_per_s(device: str, name: str, knobs: dict[str, Any], steps: int) -> float:
    from profilednn.memory.training import build_on_device, timed_steps

    state = build_on_device(name, device=device, **knobs)
    timed_steps(state, 1)
    return knobs["batch_size"] / (statistics.median(timed_steps(state, steps)) / 1e3)


def pipeline_gpu(host: Host, quick: bool) -> list[Row]:
    """A two-stage 1F1B pipeline over the GPU and the CPU against each device alone."""
    import torch

    from profilednn.memory.pipeline.runner import train_pipeline

    name, knobs = "resnet50", {"batch_size": 16 if quick else 32, "image_size": 64 if quick else 128}
    steps = 3 if quick else 4
    gpu = _items_per_s(GPU, name, knobs, steps)
    cpu = _items_per_s("cpu", name, knobs, 2)
    with tempfile.TemporaryDirectory(prefix="verify-pipeline-") as runs:
        res = train_pipeline(name, [torch.device(GPU), torch.device("cpu")], schedule="1f1b", microbatches=4,
                             steps=steps, batch_size=knobs["batch_size"], knobs={"image_size": knobs["image_size"]},
                             reference=False, runs_dir=runs)
    pipe = knobs["batch_size"] / (res.summary["median_step_ms"] / 1e3)
    return [Row.judged(PART, "pipeline_gpu", "CPU/GPU pipeline trains faster than the CPU alone", pipe > cpu,
                       f"pipeline {pipe:.1f} items/s; GPU alone {gpu:.1f}; CPU alone {cpu:.1f} "
                       f"({pipe / gpu:.2f}x GPU alone)", pipe / cpu, reason=f"{name} {knobs}, 1f1b, 4 micro-batches")]


def gpu_profile(host: Host, quick: bool) -> list[Row]:
    """ProfileDNN's capture observes CPU training (oneDNN verbose and CPU ops)."""
    return [Row(PART, "gpu_profile", "a GPU training step profiled by `profilednn profile`", "n/a",
                reason="the capture observes CPU steps only (oneDNN verbose, CPU ops); a GPU step is not captured")]


__all__ = ["footprint_gpu", "gpu_profile", "offload_gpu", "pipeline_gpu"]

"""Pipeline training of a named model end to end: layers, balance, schedule, results.

``digits_mlp`` trains on scikit-learn's digits (real data: test accuracy is reported, next
to plain single-device training with the same updates); built-in workloads train on their
synthetic batches for ``steps`` mini-batches.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import torch
from torch import nn

from ...errors import InputError
from ...run import Run, create_run
from ...tables import PIPELINE_STAGES, PIPELINE_STEPS
from .balancer import Balance, balance_layers, layer_memory, layer_times_from_run, measure_layer_times
from .schedules import PipelineTrainer
from .stages import LayerSequence, split_layers
from .tasks import DIGITS, PipelineTask, build_task, digits_task

STAGE_SCHEMA = PIPELINE_STAGES.schema  # the catalogue's (profilednn.tables)
STEP_SCHEMA = PIPELINE_STEPS.schema


@dataclass
class PipelineResult:
    """Per-stage table (``STAGE_SCHEMA``), per-step table (``STEP_SCHEMA``), summary, and
    the Run that keeps them (``pipeline_stages``, ``pipeline_steps``, ``manifest["pipeline"]``)."""

    stages: pl.DataFrame
    steps: pl.DataFrame
    summary: dict[str, Any] = field(default_factory=dict)
    run: Run | None = None


def _micro(batch: tuple[torch.Tensor, torch.Tensor], m: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    x, y = batch
    return list(zip(x.chunk(m), y.chunk(m)))


@torch.no_grad()
def _accuracy(forward: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> float:
    return float((forward(x).argmax(dim=1).cpu() == y).float().mean())


def _stage_rows(layers: LayerSequence, counts: list[int], devices: list[torch.device],
                stage_modules: list[nn.Module], times: list[float], memory: list[tuple[int, int]],
                busy: list[float | None], in_flight: list[int | None], versions: list[int | None]) -> pl.DataFrame:
    rows, start = [], 0
    for s, (count, device) in enumerate(zip(counts, devices)):
        idx = range(start, start + count)
        rows.append({
            "stage": s, "device": str(device), "layers": count, "first_layer": layers.names[idx[0]],
            "last_layer": layers.names[idx[-1]],
            "params_bytes": sum(p.numel() * p.element_size() for p in stage_modules[s].parameters()),
            "activation_bytes_per_microbatch": sum(memory[i][1] for i in idx),
            "predicted_ms": sum(times[i] for i in idx), "busy_ms": busy[s],
            "max_in_flight": in_flight[s], "max_weight_versions": versions[s],
        })
        start += count
    return pl.DataFrame(rows, schema=STAGE_SCHEMA)


def _multiprocess_result(spec: dict[str, Any], task: PipelineTask, stage_modules: list[nn.Module], counts: list[int],
                         devices: list[torch.device], schedule: str, microbatches: int, times: list[float],
                         memory: list[tuple[int, int]], given: bool, reference: bool) -> PipelineResult:
    from .multiprocess import run_multiprocess

    out = run_multiprocess({**spec, "balance": counts, "schedule": schedule, "microbatches": microbatches},
                           len(counts))
    for module, state in zip(stage_modules, out["states"]):
        module.load_state_dict(state)
    items = int(task.batches[0][0].shape[0])
    steps_df = pl.DataFrame([{"step": i, "loss": loss, "wall_ms": ms, "items_per_s": items / (ms / 1000.0)}
                             for i, (loss, ms) in enumerate(zip(out["losses"], out["wall_ms"]))], schema=STEP_SCHEMA)
    none = [None] * len(counts)
    summary: dict[str, Any] = {
        "model": spec["name"], "schedule": schedule, "devices": [str(d) for d in devices],
        "microbatches": microbatches, "balance": counts, "balance_source": "given" if given else "measured",
        "processes": len(counts), "engine": "torch.distributed.pipelining", "steps": len(task.batches),
        "batch_size": items, "median_step_ms": out["median_step_ms"], "final_loss": out["losses"][-1],
    }
    if task.test is not None:
        model = nn.Sequential(*stage_modules).eval()
        summary["accuracy"] = _accuracy(model, *task.test)
        if reference:
            summary["reference_accuracy"] = plain_reference(
                spec["name"], microbatches=microbatches, schedule=schedule, batch_size=spec["batch_size"] or 64,
                epochs=spec["epochs"], lr=spec["lr"], seed=spec["seed"])
    return PipelineResult(_stage_rows(task.layers, counts, devices, stage_modules, times, memory, none, none, none),
                          steps_df, summary)


def plain_reference(name: str, *, microbatches: int, schedule: str, batch_size: int = 64, epochs: int = 10,
                    lr: float = 0.05, seed: int = 0) -> float:
    """Test accuracy of plain one-device training of the digits MLP with the same updates
    the pipeline makes (one per micro-batch for ``async``, one per mini-batch otherwise)."""
    if name != DIGITS:
        raise InputError("a plain accuracy reference exists for digits_mlp only")
    task = digits_task(batch_size, epochs, lr, seed)
    step = task.plain_step()
    for batch in task.batches:
        for part in (_micro(batch, microbatches) if schedule == "async" else [batch]):
            step.run(part)
    assert task.test is not None
    return _accuracy(step.model.eval(), *task.test)


def choose_balance(task_layers: LayerSequence, sample: torch.Tensor, n_stages: int, schedule: str,
                   microbatches: int, run: Any | None = None, speeds: list[float] | None = None,
                   memory_caps: list[int | None] | None = None) -> tuple[Balance, list[float], list[tuple[int, int]]]:
    """The balancer's cut from per-layer times (the Run's when given, else measured on
    ``sample``) and per-layer memory (activations times the micro-batches in flight)."""
    micro = sample[: max(1, sample.shape[0] // microbatches)]
    times = layer_times_from_run(run.layers, task_layers.names) if run is not None else \
        measure_layer_times(task_layers.model, micro)
    memory = layer_memory(task_layers.model, micro)
    in_flight = microbatches if schedule == "gpipe" else min(n_stages, microbatches)
    per_layer = [state + saved * in_flight for state, saved in memory]
    return balance_layers(times, n_stages, per_layer, memory_caps, speeds), times, memory


def train_pipeline(
    name: str,
    devices: list[torch.device],
    *,
    schedule: str = "1f1b",
    microbatches: int = 4,
    balance: list[int] | None = None,
    stash: bool = True,
    average: bool = False,
    threads: bool | None = None,
    processes: bool = False,
    steps: int = 5,
    epochs: int = 10,
    batch_size: int | None = None,
    lr: float = 0.05,
    seed: int = 0,
    run: Any | None = None,
    knobs: dict[str, Any] | None = None,
    reference: bool = True,
    progress: Callable[[int, int], None] | None = None,
    runs_dir: Path | str = "runs",
    command: list[str] | str | None = None,
) -> PipelineResult:
    """Train ``name`` as a pipeline over ``devices`` and report per stage and per step.

    ``threads``: one thread per stage (default when a stage is on an accelerator, where
    stages really overlap); otherwise one thread runs the stages' operations in schedule
    order (CPU stages in one process share the same cores). ``processes``: one CPU process
    per stage on ``torch.distributed.pipelining`` (gpipe and 1f1b). ``run``: a profiled
    Run whose per-layer times drive the balancer. The outcome is kept as a new Run under
    ``runs_dir`` (``result.run``), which ends ``failed`` or ``interrupted`` if training does.
    """
    if microbatches < 1:
        raise InputError(f"--microbatches must be >= 1, not {microbatches}")
    spec = {"name": name, "steps": steps, "epochs": epochs, "batch_size": batch_size, "lr": lr, "seed": seed,
            "knobs": dict(knobs or {})}
    task = build_task(spec)
    if task.batches[0][0].shape[0] < microbatches:
        raise InputError(f"a batch of {task.batches[0][0].shape[0]} cannot be cut into {microbatches} micro-batches")
    if processes and any(d.type != "cpu" for d in devices):
        raise InputError("several processes (--processes) run CPU stages only; use --stages cpu,cpu,...")
    if threads is None:
        threads = any(d.type != "cpu" for d in devices)
    from ...capture.fingerprint import fingerprint

    with create_run(runs_dir, label=f"pipeline-{name}", command=command,
                    workload={"kind": "pipeline", "name": name, "config": dict(knobs or {})},
                    fingerprint=fingerprint()) as pipeline_run:
        result = _train(task, spec, devices, schedule=schedule, microbatches=microbatches, balance=balance,
                        stash=stash, average=average, threads=threads, processes=processes, run=run,
                        reference=reference, progress=progress)
        pipeline_run.update(workload={"kind": "pipeline", "name": name,
                                      "config": {**(knobs or {}), "batch_size": result.summary["batch_size"]}})
        pipeline_run.write_table(PIPELINE_STAGES, result.stages)
        pipeline_run.write_table(PIPELINE_STEPS, result.steps)
        pipeline_run.set_status("complete", pipeline=result.summary)
    result.run = pipeline_run
    return result


def _train(task: PipelineTask, spec: dict[str, Any], devices: list[torch.device], *, schedule: str,
           microbatches: int, balance: list[int] | None, stash: bool, average: bool, threads: bool,
           processes: bool, run: Any | None, reference: bool,
           progress: Callable[[int, int], None] | None) -> PipelineResult:
    """The training itself, once the arguments are checked (see ``train_pipeline``)."""
    name, epochs, batch_size, lr, seed = spec["name"], spec["epochs"], spec["batch_size"], spec["lr"], spec["seed"]
    layers = task.layers
    cut, times, memory = choose_balance(layers, task.batches[0][0], len(devices), schedule, microbatches, run)
    counts = balance if balance is not None else cut.counts
    stage_modules = split_layers(layers.model, counts)
    if processes:
        return _multiprocess_result(spec, task, stage_modules, counts, devices, schedule, microbatches,
                                    times, memory, balance is not None, reference)
    trainer = PipelineTrainer(stage_modules, devices, task.loss_fn, task.make_optimizer,
                              schedule=schedule, stash=stash, average=average, threads=threads)
    rows = []
    busy = [0.0] * len(devices)
    in_flight = [0] * len(devices)
    versions = [0] * len(devices)
    for i, batch in enumerate(task.batches):
        res = trainer.run(_micro(batch, microbatches))
        rows.append({"step": i, "loss": res.loss, "wall_ms": res.wall_ms,
                     "items_per_s": batch[0].shape[0] / (res.wall_ms / 1000.0) if res.wall_ms > 0 else None})
        busy = [a + b for a, b in zip(busy, res.busy_ms)]
        in_flight = [max(a, b) for a, b in zip(in_flight, res.max_in_flight)]
        versions = [max(a, b) for a, b in zip(versions, res.max_versions)]
        if progress is not None:
            progress(i + 1, len(task.batches))
    n_runs = max(1, len(task.batches))
    stages_df = _stage_rows(layers, counts, devices, stage_modules, times, memory,
                            [b / n_runs for b in busy], list(in_flight), list(versions))
    steps_df = pl.DataFrame(rows, schema=STEP_SCHEMA)
    summary: dict[str, Any] = {
        "model": name, "schedule": schedule, "devices": [str(d) for d in devices], "microbatches": microbatches,
        "balance": counts, "balance_source": "given" if balance is not None else ("run" if run is not None else "measured"),
        "stash": stash, "average": average, "threads": threads, "engine": "profilednn (one process)",
        "steps": len(task.batches),
        "batch_size": int(task.batches[0][0].shape[0]),
        "median_step_ms": statistics.median(steps_df["wall_ms"].to_list()),
        "final_loss": float(steps_df["loss"][-1]),
    }
    if task.test is not None:
        trainer.train(False)
        summary["accuracy"] = _accuracy(trainer.forward, *task.test)
        if average:
            summary["averaged_accuracy"] = _accuracy(lambda x: trainer.forward(x, averaged=True), *task.test)
        if reference:
            summary["reference_accuracy"] = plain_reference(name, microbatches=microbatches, schedule=schedule,
                                                            batch_size=batch_size or 64, epochs=epochs, lr=lr,
                                                            seed=seed)
    return PipelineResult(stages_df, steps_df, summary)


__all__ = ["DIGITS", "PipelineResult", "choose_balance", "plain_reference", "train_pipeline"]

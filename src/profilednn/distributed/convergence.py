"""Convergence vs global batch (seed 000, Fig 7) on a real task: scikit-learn's digits.

Scaling out with a fixed local batch grows the global batch, and a larger global batch
needs more epochs to reach the same accuracy: fewer (if larger) updates per epoch. This
study trains the digits MLP to a target test accuracy at several global batches and
reports epochs-to-target, normalized to the smallest batch.

Each global batch is trained in this one process on the whole global batch. That is the
same computation W ranks do under DDP with the batch split W ways (the test suite checks
the parameters agree to float32 rounding), so the epochs do not depend on the rank count,
only on the global batch. No download: the digits ship inside scikit-learn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import polars as pl
import torch
from torch import nn

from ..errors import InputError
from ..run import Run, create_run, load_run
from ..tables import CONVERGENCE
from ..workloads.digits import accuracy, digits_mlp, load_digits_data
from .data import TensorDatasetBatches

LR_SCALING = ("none", "sqrt", "linear")
DEFAULT_BATCHES = (16, 32, 64, 128, 256, 512)
SLOWDOWN_LIMIT = 1.25  # advice: largest global batch within 25 % of the best epochs-to-target


@dataclass
class ConvergenceResult:
    run: Run
    table: pl.DataFrame
    advice: list[str] = field(default_factory=list)


def scaled_lr(lr: float, global_batch: int, base_batch: int, scaling: str) -> float:
    """The learning rate at ``global_batch`` given ``lr`` at ``base_batch``."""
    if scaling == "none":
        return lr
    ratio = global_batch / base_batch
    return lr * (math.sqrt(ratio) if scaling == "sqrt" else ratio)


def epochs_to_target(
    global_batch: int,
    *,
    target: float,
    max_epochs: int,
    lr: float,
    seed: int = 0,
) -> tuple[int | None, float, list[float]]:
    """Train the digits MLP at ``global_batch``; (first epoch reaching ``target`` or None,
    best test accuracy, accuracy after each epoch)."""
    data = load_digits_data(seed=0)
    model = digits_mlp(seed=seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    batches = TensorDatasetBatches(data.x_train, data.y_train, global_batch, 0, 1, seed)
    history: list[float] = []
    for epoch in range(max_epochs):
        for step in range(epoch * batches.steps_per_epoch, (epoch + 1) * batches.steps_per_epoch):
            x, y = batches.batch(step)
            loss = loss_fn(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        acc = accuracy(model, data.x_test, data.y_test)
        history.append(acc)
        if not math.isfinite(loss.item()):
            break
        if acc >= target:
            return epoch + 1, max(history), history
    return None, max(history) if history else 0.0, history


def convergence_advice(table: pl.DataFrame, ranks: list[int] | None = None) -> list[str]:
    """What the curve means when scaling out: the largest global batch that converges
    about as fast as the best, and the local batch that keeps a rank count under it."""
    reached = table.filter(pl.col("epochs_to_target").is_not_null()).sort("global_batch")
    out: list[str] = []
    missed = table.filter(pl.col("epochs_to_target").is_null())["global_batch"].to_list()
    if reached.height == 0:
        return ["no global batch reached the target; lower --target or raise --max-epochs"]
    best = float(reached["epochs_to_target"].min())
    ok = reached.filter(pl.col("epochs_to_target") <= best * SLOWDOWN_LIMIT)["global_batch"].max()
    worst = reached.sort("global_batch").row(-1, named=True)
    first = reached.row(0, named=True)
    if worst["global_batch"] > first["global_batch"]:
        out.append(f"global batch {first['global_batch']} -> {worst['global_batch']}: epochs to target "
                   f"{first['epochs_to_target']} -> {worst['epochs_to_target']} "
                   f"({worst['epochs_to_target'] / first['epochs_to_target']:.1f}x)")
    out.append(f"global batches up to {ok} reach the target within {SLOWDOWN_LIMIT:.2f}x of the fewest epochs "
               f"({best:.0f}); beyond that, extra ranks buy throughput but lose it again in epochs")
    for r in ranks or []:
        local = max(1, int(ok) // r)
        out.append(f"with {r} ranks keep the local batch <= {local} (global {local * r}) rather than "
                   "growing the global batch with the rank count")
    if missed:
        out.append(f"global batch {', '.join(map(str, missed))} did not reach the target within the epoch limit")
    return out


def convergence_study(
    global_batches: list[int] | tuple[int, ...] = DEFAULT_BATCHES,
    *,
    target: float = 0.95,
    max_epochs: int = 60,
    lr: float = 0.05,
    base_batch: int = 32,
    lr_scaling: str = "sqrt",
    seeds: list[int] | tuple[int, ...] = (0,),
    ranks: list[int] | None = None,
    threads: int = 1,
    runs_dir: Path | str = "runs",
    progress: Callable[[int, int, str], None] | None = None,
) -> ConvergenceResult:
    """Epochs to ``target`` test accuracy at each global batch (median over ``seeds``).

    ``threads``: intra-op threads while training (one is fastest for this tiny MLP; more
    only add OpenMP synchronisation to kernels of a few microseconds).
    """
    if threads < 1:
        raise InputError(f"--threads must be >= 1, not {threads}")
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _study(list(global_batches), target, max_epochs, lr, base_batch, lr_scaling, list(seeds), ranks,
                      Path(runs_dir), progress)
    finally:
        torch.set_num_threads(previous)


def _study(global_batches: list[int], target: float, max_epochs: int, lr: float, base_batch: int, lr_scaling: str,
           seeds: list[int], ranks: list[int] | None, runs_dir: Path,
           progress: Callable[[int, int, str], None] | None) -> ConvergenceResult:
    if not 0.0 < target <= 1.0:
        raise InputError(f"--target must be in (0, 1], not {target}")
    if lr_scaling not in LR_SCALING:
        raise InputError(f"--lr-scaling must be one of {', '.join(LR_SCALING)}, not {lr_scaling!r}")
    if max_epochs < 1 or not global_batches or not seeds:
        raise InputError("need --max-epochs >= 1, at least one global batch and one seed")
    train_size = len(load_digits_data(seed=0).y_train)
    bad = [g for g in global_batches if not 1 <= g <= train_size]
    if bad:
        raise InputError(f"global batch {bad[0]} is outside 1..{train_size} (the digits training set)")
    with create_run(runs_dir, label="convergence", command=["profilednn", "convergence"],
                    workload={"kind": "builtin", "name": "digits", "config": {"hidden": [128, 64]}},
                    convergence={"target": target, "max_epochs": max_epochs, "lr": lr, "base_batch": base_batch,
                                 "lr_scaling": lr_scaling, "seeds": list(seeds)}) as run:
        rows = []
        total = len(global_batches) * len(seeds)
        for i, g in enumerate(sorted(global_batches)):
            lr_g = scaled_lr(lr, g, base_batch, lr_scaling)
            epochs, bests = [], []
            for j, seed in enumerate(seeds):
                if progress:
                    progress(i * len(seeds) + j, total, f"global batch {g}, seed {seed}")
                e, best, _ = epochs_to_target(g, target=target, max_epochs=max_epochs, lr=lr_g, seed=seed)
                epochs.append(e)
                bests.append(best)
            reached = sorted(e for e in epochs if e is not None)
            median = reached[len(reached) // 2] if len(reached) * 2 > len(epochs) else None
            spe = train_size // g
            rows.append({"global_batch": g, "lr": lr_g, "steps_per_epoch": spe, "epochs_to_target": median,
                         "steps_to_target": median * spe if median is not None else None,
                         "seeds_reached": len(reached), "best_accuracy": max(bests)})
        if progress:
            progress(total, total, "done")
        # against the smallest global batch that reached the target
        base = next((r["epochs_to_target"] for r in rows if r["epochs_to_target"] is not None), None)
        for row in rows:
            e = row["epochs_to_target"]
            row["convergence_ratio"] = e / base if base and e is not None else None
        table = CONVERGENCE.frame(rows)
        advice = convergence_advice(table, ranks)
        from .charts import convergence_chart
        from .studies import complete_study

        complete_study(run, CONVERGENCE, table, convergence_chart(table), advice=advice)
    return ConvergenceResult(run=load_run(run.path), table=table, advice=advice)


__all__ = ["ConvergenceResult", "DEFAULT_BATCHES", "LR_SCALING", "convergence_advice", "convergence_study",
           "epochs_to_target", "scaled_lr"]

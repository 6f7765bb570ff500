"""CLI verbs of the memory job: ``memory`` and ``pipeline``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from .options import (
    BatchSize, ChannelsLast, Dtype, ImageSize, NumClasses, Oversubscribe, RunsDir, Seed, SeqLen, Threads,
    OptionalModelName, Wide, check_dtype, command_line, size_knobs,
)
from .app import app, console, err_console
from .progress import progress_bar

_command = command_line


@app.command("memory")
def memory_cmd(
    run_path: Annotated[Optional[Path], typer.Argument(
        metavar="[RUN]", help="A profiled Run to add memory tables to (rebuilds its workload).")] = None,
    model: OptionalModelName = None,
    batch_size: BatchSize = None,
    image_size: ImageSize = None,
    seq_len: SeqLen = None,
    num_classes: NumClasses = None,
    channels_last: ChannelsLast = False,
    dtype: Dtype = "fp32",
    seed: Seed = 0,
    threads: Threads = None,
    oversubscribe: Oversubscribe = False,
    device: Annotated[str, typer.Option(help="Device to measure on: cpu, cuda:0, ...")] = "cpu",
    budget: Annotated[Optional[str], typer.Option(
        help="Find the largest batch that fits this much memory (e.g. 8GiB).")] = None,
    confirm: Annotated[bool, typer.Option(
        "--confirm/--no-confirm", help="Confirm the budget's batch by a run.")] = True,
    tradeoff: Annotated[bool, typer.Option(
        "--tradeoff", help="Also tabulate memory vs step time: none/offload/checkpoint/both.")] = False,
    checkpoint: Annotated[str, typer.Option(
        "--checkpoint", help="Checkpoint policy for the trade-off: every:K or types:Name,...")] = "every:2",
    offload_min_bytes: Annotated[Optional[str], typer.Option(
        help="Offload threshold for the trade-off (e.g. 256KiB; smaller tensors stay).")] = None,
    top: Annotated[int, typer.Option(help="Layers shown in the table.")] = 20,
    runs_dir: RunsDir = Path("runs"),
    wide: Wide = False,
) -> None:
    """Training memory per layer (weights, gradients, optimizer state, saved activations,
    workspace), predicted vs measured peak, and the largest batch for --budget.

    Writes a Run (or adds its tables to RUN) so `profilednn report` shows a memory section.
    """
    from ..memory.api import memory_run, parse_bytes
    from ..memory.terminal import print_memory

    if (model is None) == (run_path is None):
        raise typer.BadParameter("give --model NAME or a RUN directory (one of them)")
    check_dtype(dtype)
    knobs = size_knobs(batch_size=batch_size, image_size=image_size, seq_len=seq_len,
                       num_classes=num_classes)
    if run_path is None:
        knobs.update(dtype=dtype, channels_last=channels_last, seed=seed)
    budget_bytes = parse_bytes(budget) if budget is not None else None
    min_bytes = parse_bytes(offload_min_bytes, allow_zero=True) if offload_min_bytes is not None else None
    with Progress(SpinnerColumn(), TextColumn("{task.description}", style="bold", markup=False), TimeElapsedColumn(),
                  console=err_console, transient=True) as bar:
        task = bar.add_task("memory", total=None)
        run = memory_run(model, runs_dir, run_path=run_path, command=_command(), knobs=knobs, device=device,
                         threads=threads,
                         budget_bytes=budget_bytes, confirm=confirm, tradeoff=tradeoff,
                         checkpoint_policy=checkpoint, offload_min_bytes=min_bytes,
                         progress=lambda text: bar.update(task, description=f"memory: {text}"))
    print_memory(run, console, top, wide=wide)
    console.print(f"Run: {run.path}  ({run.status})", soft_wrap=True, highlight=False)


@app.command("pipeline")
def pipeline_cmd(
    model: Annotated[str, typer.Option(
        "--model", "-m", help="digits_mlp (real data, accuracy), small_cnn, resnet50, ...")],
    stages: Annotated[str, typer.Option(
        "--stages", help="One device per stage, e.g. cuda:0,cpu or cpu,cpu.")] = "cpu,cpu",
    schedule: Annotated[str, typer.Option("--schedule", help="gpipe | 1f1b | async")] = "1f1b",
    microbatches: Annotated[int, typer.Option("--microbatches", help="Micro-batches per mini-batch.")] = 4,
    balance: Annotated[Optional[str], typer.Option(
        help="Layers per stage, e.g. 5,3 (default: the balancer decides).")] = None,
    from_run: Annotated[Optional[Path], typer.Option(
        "--from-run", help="A profiled Run whose per-layer times drive the balancer.")] = None,
    stash: Annotated[bool, typer.Option(
        "--stash/--no-stash", help="async: weight stashing (backward uses its forward's weights).")] = True,
    average: Annotated[bool, typer.Option(
        "--average", help="Keep a running average of the weights (SWA) and report its accuracy.")] = False,
    processes: Annotated[bool, typer.Option(
        "--processes", help="One CPU process per stage on torch.distributed.pipelining (gpipe/1f1b).")] = False,
    steps: Annotated[int, typer.Option(help="Mini-batches for built-in workloads.")] = 5,
    epochs: Annotated[int, typer.Option(help="Epochs for digits_mlp.")] = 10,
    batch_size: Annotated[Optional[int], typer.Option(help="Mini-batch size.")] = None,
    image_size: ImageSize = None,
    num_classes: NumClasses = None,
    lr: Annotated[float, typer.Option(help="Learning rate (digits_mlp).")] = 0.05,
    seed: Annotated[int, typer.Option(help="Seed.")] = 0,
    runs_dir: RunsDir = Path("runs"),
    wide: Wide = False,
) -> None:
    """Train a model split into stages on devices with a pipeline schedule.

    Prints the stages (layers, weights, activations per micro-batch, busy time) and the
    training result (test accuracy next to plain training for digits_mlp); writes a Run.
    """
    from ..errors import InputError
    from ..memory.api import SCHEDULES, parse_balance, parse_stages, train_pipeline
    from ..memory.terminal import pipeline_title, print_pipeline
    from ..run import load_run

    if schedule not in SCHEDULES:
        raise InputError(f"--schedule must be one of {', '.join(SCHEDULES)}, not {schedule!r}")
    devices = parse_stages(stages)
    counts = parse_balance(balance, len(devices))
    profiled = load_run(from_run) if from_run is not None else None
    knobs = size_knobs(image_size=image_size, num_classes=num_classes)
    with progress_bar() as bar:
        task = bar.add_task(f"{schedule} over {stages}", total=None)
        result = train_pipeline(model, devices, schedule=schedule, microbatches=microbatches, balance=counts,
                                stash=stash, average=average, processes=processes, steps=steps, epochs=epochs,
                                batch_size=batch_size, lr=lr, seed=seed, run=profiled, knobs=knobs,
                                progress=lambda i, n: bar.update(task, completed=i, total=n),
                                runs_dir=runs_dir, command=_command())
    run = result.run

    print_pipeline(result, pipeline_title(model, {**result.summary, "schedule": schedule,
                                                  "microbatches": microbatches}), console, wide=wide)
    console.print(f"Run: {run.path}  ({run.status})", soft_wrap=True, highlight=False)

"""CLI verbs of the memory job: ``memory`` and ``pipeline``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from .options import (
    BatchSize, ChannelsLast, Dtype, ImageSize, NumClasses, Oversubscribe, RunsDir, Seed, SeqLen, Threads,
    check_dtype, known_model, size_knobs,
)
from .app import app, console, err_console, styled



def _command() -> list[str] | None:
    return ["profilednn", *sys.argv[1:]] if sys.argv and "profilednn" in sys.argv[0] else None


def _mib(n: object) -> str:
    from ..memory.units import format_bytes

    return format_bytes(n)  # type: ignore[arg-type]


@app.command("memory")
def memory_cmd(
    run_path: Annotated[Optional[Path], typer.Argument(metavar="[RUN]", help="A profiled Run to add memory tables to (rebuilds its workload).")] = None,
    model: Annotated[Optional[str], typer.Option("--model", "-m", callback=known_model,
                                                 help="Built-in workload (see `profilednn models`).")] = None,
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
    budget: Annotated[Optional[str], typer.Option(help="Find the largest batch that fits this much memory (e.g. 8GiB).")] = None,
    confirm: Annotated[bool, typer.Option("--confirm/--no-confirm", help="Confirm the budget's batch by a run.")] = True,
    tradeoff: Annotated[bool, typer.Option("--tradeoff", help="Also tabulate memory vs step time: none/offload/checkpoint/both.")] = False,
    checkpoint: Annotated[str, typer.Option("--checkpoint", help="Checkpoint policy for the trade-off: every:K or types:Name,...")] = "every:2",
    offload_min_bytes: Annotated[Optional[str], typer.Option(help="Offload threshold for the trade-off (e.g. 256KiB; smaller tensors stay).")] = None,
    top: Annotated[int, typer.Option(help="Layers shown in the table.")] = 20,
    runs_dir: RunsDir = Path("runs"),
) -> None:
    """Training memory per layer (weights, gradients, optimizer state, saved activations,
    workspace), predicted vs measured peak, and the largest batch for --budget.

    Writes a Run (or adds its tables to RUN) so `profilednn report` shows a memory section.
    """
    from ..memory.runs import memory_run
    from ..memory.units import parse_bytes

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
    _print_memory(run, top)
    console.print(f"Run: {run.path}  ({run.status})", soft_wrap=True, highlight=False)


def _print_memory(run: object, top: int) -> None:
    mem = run.manifest.get("memory") or {}  # type: ignore[attr-defined]
    layers = run.table("memory_layers").sort("saved_measured_bytes", descending=True)  # type: ignore[attr-defined]
    table = Table(title=f"{mem.get('workload', '')} batch {mem.get('batch_size', '')} on {mem.get('device', '')}: "
                        f"memory per layer (largest saved activations first)", title_justify="left")
    cols = [("layer", "module"), ("type", "module_type"), ("weights", "params_bytes"), ("grads", "grad_bytes"),
            ("optim state", "optimizer_state_bytes"), ("saved pred.", "saved_predicted_bytes"),
            ("saved meas.", "saved_measured_bytes"), ("workspace", "workspace_bytes")]
    for label, _ in cols:
        table.add_column(label, justify="left" if label in ("layer", "type") else "right")
    for r in layers.head(top).iter_rows(named=True):
        table.add_row(*[str(r[c]) if c in ("module", "module_type") else _mib(r[c]) for _, c in cols])
    if layers.height > top:
        rest = layers.slice(top)
        table.add_row(f"... {rest.height} more", "", *[_mib(rest[c].sum()) for _, c in cols[2:]])
    console.print(table)
    summary = run.table("memory_summary")  # type: ignore[attr-defined]
    st = Table(title="predicted vs measured", title_justify="left")
    for c in ("quantity", "predicted", "measured", "error"):
        st.add_column(c, justify="left" if c == "quantity" else "right")
    for r in summary.iter_rows(named=True):
        p, m = r["predicted_bytes"], r["measured_bytes"]
        err = f"{(p / m - 1) * 100:+.1f}%" if m else ""
        st.add_row(r["quantity"], _mib(p), _mib(m), err)
    console.print(st)
    console.print(f"RSS: {_mib(mem.get('rss_start_bytes'))} at start, {_mib(mem.get('rss_peak_bytes'))} peak "
                  "(process resident memory; includes the allocator's cache)", highlight=False)
    budget = mem.get("budget")
    if budget:
        confirmed = budget.get("confirmed_batch")
        console.print(f"budget {_mib(budget['budget_bytes'])}: predicted batch {budget['predicted_batch']} "
                      f"(fixed {_mib(budget['fixed_bytes'])} + {_mib(budget['bytes_per_item'])} per item); "
                      + (f"confirmed batch {confirmed} by a run" if confirmed is not None else "not confirmed"),
                      highlight=False)
    if run.has_table("memory_tradeoff"):  # type: ignore[attr-defined]
        tr = run.table("memory_tradeoff")  # type: ignore[attr-defined]
        tt = Table(title="memory vs step time", title_justify="left")
        for c in ("config", "checkpoint", "saved on device", "offloaded", "peak", "peak/none", "step ms", "slowdown"):
            tt.add_column(c, justify="left" if c in ("config", "checkpoint") else "right")
        for r in tr.iter_rows(named=True):
            tt.add_row(r["config"], r["checkpoint_policy"], _mib(r["saved_device_bytes"]), _mib(r["offloaded_bytes"]),
                       _mib(r["peak_bytes"]), f"{r['peak_vs_none']:.2f}", f"{r['step_ms']:.1f}",
                       f"{r['slowdown_vs_none']:.2f}x")
        console.print(tt)
        if tr["device"][0] == "cpu":
            console.print(styled("note:", "yellow", " on a CPU the host is the device: offloading copies "
                                 "without lowering the peak; it pays off on an accelerator."))
    for note in mem.get("notes") or []:
        console.print(styled("note:", "yellow", f" {note}"))


@app.command("pipeline")
def pipeline_cmd(
    model: Annotated[str, typer.Option("--model", "-m", help="digits_mlp (real data, accuracy), small_cnn, resnet50, ...")],
    stages: Annotated[str, typer.Option("--stages", help="One device per stage, e.g. cuda:0,cpu or cpu,cpu.")] = "cpu,cpu",
    schedule: Annotated[str, typer.Option("--schedule", help="gpipe | 1f1b | async")] = "1f1b",
    microbatches: Annotated[int, typer.Option("--microbatches", help="Micro-batches per mini-batch.")] = 4,
    balance: Annotated[Optional[str], typer.Option(help="Layers per stage, e.g. 5,3 (default: the balancer decides).")] = None,
    from_run: Annotated[Optional[Path], typer.Option("--from-run", help="A profiled Run whose per-layer times drive the balancer.")] = None,
    stash: Annotated[bool, typer.Option("--stash/--no-stash", help="async: weight stashing (backward uses its forward's weights).")] = True,
    average: Annotated[bool, typer.Option("--average", help="Keep a running average of the weights (SWA) and report its accuracy.")] = False,
    processes: Annotated[bool, typer.Option("--processes", help="One CPU process per stage on torch.distributed.pipelining (gpipe/1f1b).")] = False,
    steps: Annotated[int, typer.Option(help="Mini-batches for built-in workloads.")] = 5,
    epochs: Annotated[int, typer.Option(help="Epochs for digits_mlp.")] = 10,
    batch_size: Annotated[Optional[int], typer.Option(help="Mini-batch size.")] = None,
    image_size: ImageSize = None,
    num_classes: NumClasses = None,
    lr: Annotated[float, typer.Option(help="Learning rate (digits_mlp).")] = 0.05,
    seed: Annotated[int, typer.Option(help="Seed.")] = 0,
    runs_dir: RunsDir = Path("runs"),
) -> None:
    """Train a model split into stages on devices with a pipeline schedule.

    Prints the stages (layers, weights, activations per micro-batch, busy time) and the
    training result (test accuracy next to plain training for digits_mlp); writes a Run.
    """
    from ..capture.fingerprint import fingerprint
    from ..errors import InputError
    from ..memory.pipeline import parse_stages, train_pipeline
    from ..memory.pipeline.schedules import SCHEDULES
    from ..memory.pipeline.stages import parse_balance
    from ..run import create_run, load_run

    if schedule not in SCHEDULES:
        raise InputError(f"--schedule must be one of {', '.join(SCHEDULES)}, not {schedule!r}")
    devices = parse_stages(stages)
    counts = parse_balance(balance, len(devices))
    profiled = load_run(from_run) if from_run is not None else None
    knobs = size_knobs(image_size=image_size, num_classes=num_classes)
    with Progress(TextColumn("{task.description}", style="bold", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err_console, transient=True) as bar:
        task = bar.add_task(f"{schedule} over {stages}", total=None)
        result = train_pipeline(model, devices, schedule=schedule, microbatches=microbatches, balance=counts,
                                stash=stash, average=average, processes=processes, steps=steps, epochs=epochs,
                                batch_size=batch_size, lr=lr, seed=seed, run=profiled, knobs=knobs,
                                progress=lambda i, n: bar.update(task, completed=i, total=n))
    run = create_run(runs_dir, label=f"pipeline-{model}", command=_command(),
                     workload={"kind": "pipeline", "name": model, "config": {**knobs, "batch_size": result.summary["batch_size"]}},
                     fingerprint=fingerprint())
    run.write_table("pipeline_stages", result.stages)
    run.write_table("pipeline_steps", result.steps)
    run.set_status("complete", pipeline=result.summary)

    s = result.summary
    table = Table(title=f"{model}: {schedule} over {', '.join(s['devices'])}, {microbatches} micro-batches "
                        f"(balance {s['balance']}, {s['balance_source']})", title_justify="left")
    for c in ("stage", "device", "layers", "weights", "act./micro-batch", "predicted ms", "busy ms/step",
              "in flight", "weight versions"):
        table.add_column(c, justify="left" if c in ("device", "layers") else "right")
    for r in result.stages.iter_rows(named=True):
        table.add_row(str(r["stage"]), r["device"], f"{r['first_layer']} .. {r['last_layer']} ({r['layers']})",
                      _mib(r["params_bytes"]), _mib(r["activation_bytes_per_microbatch"]), f"{r['predicted_ms']:.2f}",
                      "" if r["busy_ms"] is None else f"{r['busy_ms']:.1f}",
                      "" if r["max_in_flight"] is None else str(r["max_in_flight"]),
                      "" if r["max_weight_versions"] is None else str(r["max_weight_versions"]))
    console.print(table)
    line = f"{s['steps']} steps, median {s['median_step_ms']:.1f} ms/step, final loss {s['final_loss']:.4f}"
    if "accuracy" in s:
        line += f"; test accuracy {s['accuracy'] * 100:.1f}%"
        if "reference_accuracy" in s:
            line += f" (plain training: {s['reference_accuracy'] * 100:.1f}%)"
        if "averaged_accuracy" in s:
            line += f"; averaged weights {s['averaged_accuracy'] * 100:.1f}%"
    console.print(line, highlight=False)
    console.print(f"Run: {run.path}  ({run.status})", soft_wrap=True, highlight=False)

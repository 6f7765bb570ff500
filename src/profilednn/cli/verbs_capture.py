"""CLI verbs of the capture job: ``profile`` and ``demo``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from ..errors import ProfileDNNError
from .options import (
    BatchSize, ChannelsLast, Dtype, ImageSize, NumClasses, Oversubscribe, RunsDir, Seed, SeqLen, Threads,
    OptionalModelName, check_dtype, command_line, size_knobs,
)
from .app import app, console, err_console, exit_interrupted, styled
from .progress import progress_bar

if TYPE_CHECKING:  # annotations only: the Run module (polars) loads when a verb runs
    from ..run import Run


@app.command(
    "profile",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def profile_cmd(
    ctx: typer.Context,
    model: OptionalModelName = None,
    batch_size: BatchSize = None,
    image_size: ImageSize = None,
    seq_len: SeqLen = None,
    num_classes: NumClasses = None,
    steps: Annotated[int, typer.Option(min=1, help="Measured steps.")] = 3,
    warmup: Annotated[int, typer.Option(min=0, help=(
        "Warm-up steps, not measured; from 4, a full capture observes those after the first light, "
        "the reference that says which layers' times it inflated."))] = 1,
    threads: Threads = None,
    oversubscribe: Oversubscribe = False,
    channels_last: ChannelsLast = False,
    dtype: Dtype = "fp32",
    light: Annotated[bool, typer.Option(
        "--light", help="Verbose + layer/phase markers only (no torch.profiler).")] = False,
    seed: Seed = 0,
    stop_after: Annotated[bool, typer.Option(
        "--stop-after", help="Stop the script once the measured steps are captured "
                             "(default: it runs on to its end).")] = False,
    top: Annotated[int, typer.Option(help="Layers shown in the table.")] = 25,
    runs_dir: RunsDir = Path("runs"),
) -> None:
    """Profile a training workload into a Run: a built-in model, or `-- python train.py ARGS`.

    Prints the layer-wise table (forward and backward ms per layer, then loss, optimizer
    and data time) and the Run's path. A script runs on after the measured steps unless
    `--stop-after` stops it there.
    """
    script = list(ctx.args)
    command = command_line()
    if model and script:
        raise typer.BadParameter("give either --model or a script after `--`, not both")
    if not model and not script:
        raise typer.BadParameter("give --model NAME or a script after `--` (e.g. -- python train.py)")
    if stop_after and not script:
        raise typer.BadParameter("--stop-after stops a script after `--`; a built-in model always "
                                 "stops after its steps")
    check_dtype(dtype)
    from ..capture.api import profile_builtin, profile_script  # torch: only once the options are valid

    if script:
        knobs_given = [n for n, v in (("--batch-size", batch_size), ("--image-size", image_size),
                                      ("--seq-len", seq_len), ("--num-classes", num_classes)) if v is not None]
        if knobs_given or channels_last or dtype != "fp32":
            raise typer.BadParameter(f"{', '.join(knobs_given) or 'model knobs'} apply to built-in models only")
        run, code = profile_script(script, runs_dir, steps=steps, warmup=warmup, threads=threads,
                                   light=light, command=command, stop_after=stop_after)
        _report_end(run, top)
        if code:
            err_console.print(styled(f"the script exited with code {code}", "red",
                                     f"; Run kept as {run.status}: {run.path}"), soft_wrap=True)
            raise typer.Exit(code)
        return
    assert model is not None
    knobs = size_knobs(batch_size=batch_size, image_size=image_size, seq_len=seq_len,
                       num_classes=num_classes)
    with progress_bar() as bar:
        task = bar.add_task(f"profiling {model}", total=warmup + steps)
        try:
            run = profile_builtin(model, runs_dir, steps=steps, warmup=warmup, threads=threads,
                                  light=light, command=command, channels_last=channels_last,
                                  dtype=dtype, seed=seed,
                                  progress=lambda i, n: bar.update(task, completed=i), **knobs)
        except KeyboardInterrupt as exc:
            exit_interrupted(exc)
    _report_end(run, top)


def _report_end(run: Run, top: int) -> None:
    from ..capture.terminal import print_layer_table
    from ..tables import LAYERS

    if run.status == "complete" or run.has_table(LAYERS):
        try:
            if not print_layer_table(run, console, top=top):
                err_console.print("no complete step was captured; nothing to tabulate")
        except ProfileDNNError as exc:
            err_console.print(f"cannot tabulate layers: {exc}")
    console.print(f"Run: {run.path}  ({run.status})", soft_wrap=True, highlight=False)


@app.command("demo")
def demo_cmd(
    model: Annotated[str, typer.Option(help="Built-in workload to profile.")] = "resnet50",
    image_size: Annotated[int, typer.Option(help="Image side (small keeps the demo quick).")] = 64,
    batch_size: Annotated[int, typer.Option(help="Batch size.")] = 8,
    steps: Annotated[int, typer.Option(help="Measured steps.")] = 3,
    runs_dir: RunsDir = Path("runs"),
) -> None:
    """The main job on the default workload: profile, print the table, write the report."""
    from ..capture.api import profile_builtin
    from ..report.api import report_run

    with progress_bar() as bar:
        task = bar.add_task(f"profiling {model} ({batch_size}x{image_size}x{image_size})", total=1 + steps)
        run = profile_builtin(model, runs_dir, steps=steps, warmup=1, batch_size=batch_size,
                              image_size=image_size, command=["profilednn", "demo"],
                              progress=lambda i, n: bar.update(task, completed=i))
    _report_end(run, top=15)
    html = report_run(run)
    console.print(f"HTML report: {html}", soft_wrap=True, highlight=False)

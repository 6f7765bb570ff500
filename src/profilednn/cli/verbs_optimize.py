"""CLI verb of the optimize job: ``optimize``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from ..formatting import finite, print_json
from ..optimization.api import Settings
from .field_options import FROM_FIELD, options_from
from .options import (
    BatchSize, ImageSize, ModelName, NumClasses, Oversubscribe, RunsDir, SeqLen, Threads, Wide, check_dtype,
    command_line, size_knobs,
)
from .app import app, console, err_console, exit_interrupted


def _parse_sets(values: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` workload knobs; values parsed as JSON where they can be (3, 0.5, true)."""
    out: dict[str, Any] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"--set takes KEY=VALUE, got {item!r}")
        try:
            out[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.strip()] = raw
    return out


@app.command("optimize")
@options_from(Settings)
def optimize_cmd(
    model: ModelName,
    batch_size: BatchSize = None,
    image_size: ImageSize = None,
    seq_len: SeqLen = None,
    num_classes: NumClasses = None,
    threads: Threads = None,
    oversubscribe: Oversubscribe = False,
    channels_last: Annotated[bool, typer.Option(
        "--channels-last", help="Start from channels_last memory format.")] = False,
    dtype: Annotated[str, typer.Option(help="Starting dtype: fp32 or bf16 (autocast; loss kept in fp32).")] = "fp32",
    seed: int = FROM_FIELD,
    recipes: Annotated[Optional[str], typer.Option(
        "--recipes", help="Comma-separated recipes to try (default: all).")] = None,
    rounds: int = FROM_FIELD,
    warmup: int = FROM_FIELD,
    numerics_steps: int = FROM_FIELD,
    min_speedup: float = FROM_FIELD,
    child_runs: int = FROM_FIELD,
    compile_mode: Annotated[Optional[str], typer.Option(
        help="torch.compile mode for the torch_compile recipe.")] = None,
    knob: Annotated[Optional[list[str]], typer.Option(
        "--set", help="Workload knob KEY=VALUE (e.g. trainable_layers=3).")] = None,
    headroom: bool = FROM_FIELD,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    runs_dir: RunsDir = Path("runs"),
    wide: Wide = False,
) -> None:
    """Try each optimization recipe on a built-in workload; keep what is faster and trains the same.

    Every recipe is A/B-timed against the current best (interleaved medians) and checked
    for numerics (seeded loss trajectory and gradients vs stock). Writes a Run with the
    `optimize_recipes` table; `profilednn report RUN` shows it.
    """
    from ..optimization.api import optimize_workload, select_recipes
    from ..optimization.terminal import print_recipes

    check_dtype(dtype)
    chosen = select_recipes(recipes) if recipes is not None else None
    build_args: dict[str, Any] = size_knobs(batch_size=batch_size, image_size=image_size,
                                            seq_len=seq_len, num_classes=num_classes)
    build_args.update(_parse_sets(knob or []))
    build_args.update(channels_last=channels_last, dtype=dtype, seed=seed)
    options = {"compile_mode": compile_mode} if compile_mode else {}
    settings = Settings(rounds=rounds, warmup=warmup, numerics_steps=numerics_steps, min_speedup=min_speedup,
                        seed=seed, child_runs=child_runs, options=options, headroom=headroom)
    command = command_line()
    with err_console.status(f"optimizing {model}") as status:
        def progress(message: str) -> None:
            status.update(f"optimizing {model}: {message}")

        try:
            run, result = optimize_workload(model, runs_dir, chosen, threads=threads, settings=settings,
                                            progress=progress, command=command, **build_args)
        except KeyboardInterrupt as exc:
            exit_interrupted(exc)
    if as_json:
        print_json(finite({"run": str(run.path), **result.report.to_dict()}))
        return
    print_recipes(result.report, console, wide=wide)
    console.print(f"Run: {run.path}  ({run.status})", soft_wrap=True, highlight=False)

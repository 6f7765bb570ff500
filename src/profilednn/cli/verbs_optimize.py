"""CLI verb of the optimize job: ``optimize``."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from .options import (
    BatchSize, ImageSize, ModelName, NumClasses, Oversubscribe, RunsDir, SeqLen, Threads, check_dtype,
    size_knobs,
)
from .app import app, console, err_console, exit_interrupted, styled



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


def _finite(obj: Any) -> Any:
    """Non-finite floats as strings ("inf"), so that --json prints valid JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def _fmt(value: Any, spec: str) -> str:
    return "" if value is None else format(value, spec)


def print_recipes(report: Any) -> None:
    table = Table(title=f"optimize {report.workload}", title_justify="left")
    for col, just in (("recipe", "left"), ("applies", "left"), ("before ms", "right"), ("after ms", "right"),
                      ("speedup", "right"), ("numerics", "left"), ("accepted", "left"), ("why / how", "left")):
        table.add_column(col, justify=just, overflow="fold")  # type: ignore[arg-type]
    for r in report.recipes:
        verdict = r.numerics
        if r.loss_max_rel_diff is not None:
            verdict += f" (loss {r.loss_max_rel_diff:.1e}, grad {r.grad_rel_diff:.1e})"
        table.add_row(
            r.recipe, "yes" if r.applies else "no", _fmt(r.before_ms, ".1f"), _fmt(r.after_ms, ".1f"),
            "" if r.speedup is None else f"{r.speedup:.3f}x", verdict,
            styled("yes", "green") if r.accepted else "no", r.decision if r.applies else r.reason,
        )
    console.print(table)
    d = report.to_dict()
    if d["baseline"] and d["final"]:
        console.print(
            f"stock {d['baseline']['median_ms']:.1f} ms -> optimized {d['final']['median_ms']:.1f} ms "
            f"per step (median, interleaved): {d['speedup']:.2f}x"
        )
    if d["mfu_final"] is not None:
        from ..projection.dtypes import format_flops, format_peaks

        console.print(
            f"model FLOP/s: {100 * d['mfu_baseline']:.1f}% -> {100 * d['mfu_final']:.1f}% of the measured "
            f"GEMM peaks ({format_peaks(d['peak_gflops_by_dtype'], d['gemm_peak_gflops'])}, "
            f"{report.threads} threads); per step: {format_flops(d['flops_by_dtype_final'] or d['flops_by_dtype'])}"
        )
        console.print(
            f"headroom: at most {d['headroom_at_peak']:.2f}x more without fewer FLOPs or a faster number "
            "format (the whole step at the GEMM peak)", soft_wrap=True, highlight=False,
        )
    if report.final_numerics is not None:
        console.print(f"all accepted recipes together vs stock: numerics {report.final_numerics.verdict} "
                      f"({report.final_numerics.detail})", soft_wrap=True, highlight=False)
    if report.environment:
        console.print(f"launch with: {report.launch_prefix()}", soft_wrap=True, highlight=False)
    for note in report.notes:
        if not note.startswith("process-level"):
            console.print(styled("note:", "yellow", f" {note}"), soft_wrap=True)


@app.command("optimize")
def optimize_cmd(
    model: ModelName,
    batch_size: BatchSize = None,
    image_size: ImageSize = None,
    seq_len: SeqLen = None,
    num_classes: NumClasses = None,
    threads: Threads = None,
    oversubscribe: Oversubscribe = False,
    channels_last: Annotated[bool, typer.Option("--channels-last", help="Start from channels_last memory format.")] = False,
    dtype: Annotated[str, typer.Option(help="Starting dtype: fp32 or bf16 (autocast; loss kept in fp32).")] = "fp32",
    seed: Annotated[int, typer.Option(help="Seed for weights, synthetic data and the numerics check.")] = 0,
    recipes: Annotated[Optional[str], typer.Option("--recipes", help="Comma-separated recipes to try (default: all).")] = None,
    rounds: Annotated[int, typer.Option(help="Interleaved A/B samples per arm.")] = 5,
    warmup: Annotated[int, typer.Option(help="Untimed steps per arm before the A/B samples.")] = 1,
    numerics_steps: Annotated[int, typer.Option(help="Seeded steps in each numerics check.")] = 3,
    min_speedup: Annotated[float, typer.Option(help="Median speedup a recipe needs to be kept.")] = 1.02,
    child_runs: Annotated[int, typer.Option(help="Child processes per arm for process-level recipes.")] = 2,
    compile_mode: Annotated[Optional[str], typer.Option(help="torch.compile mode for the torch_compile recipe.")] = None,
    knob: Annotated[Optional[list[str]], typer.Option("--set", help="Workload knob KEY=VALUE (e.g. trainable_layers=3).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    runs_dir: RunsDir = Path("runs"),
) -> None:
    """Try each optimization recipe on a built-in workload; keep what is faster and trains the same.

    Every recipe is A/B-timed against the current best (interleaved medians) and checked
    for numerics (seeded loss trajectory and gradients vs stock). Writes a Run with the
    `optimize_recipes` table; `profilednn report RUN` shows it.
    """
    from ..optimize import Settings, optimize_workload, select_recipes

    check_dtype(dtype)
    chosen = select_recipes(recipes) if recipes is not None else None
    build_args: dict[str, Any] = size_knobs(batch_size=batch_size, image_size=image_size,
                                            seq_len=seq_len, num_classes=num_classes)
    build_args.update(_parse_sets(knob or []))
    build_args.update(channels_last=channels_last, dtype=dtype, seed=seed)
    options = {"compile_mode": compile_mode} if compile_mode else {}
    settings = Settings(rounds=rounds, warmup=warmup, numerics_steps=numerics_steps, min_speedup=min_speedup,
                        seed=seed, child_runs=child_runs, options=options)
    command = ["profilednn", *sys.argv[1:]] if sys.argv and "profilednn" in sys.argv[0] else None
    with err_console.status(f"optimizing {model}") as status:
        def progress(message: str) -> None:
            status.update(f"optimizing {model}: {message}")

        try:
            run, result = optimize_workload(model, runs_dir, chosen, threads=threads, settings=settings,
                                            progress=progress, command=command, **build_args)
        except KeyboardInterrupt as exc:
            exit_interrupted(exc)
    if as_json:
        sys.stdout.write(json.dumps(_finite({"run": str(run.path), **result.report.to_dict()}), indent=2,
                                    default=str) + "\n")
        return
    print_recipes(result.report)
    console.print(f"Run: {run.path}  ({run.status})", soft_wrap=True, highlight=False)

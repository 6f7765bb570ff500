"""``profilednn models``: the built-in training workloads, their defaults and knobs."""

from __future__ import annotations

import json

import typer
from rich.table import Table

from .app import app, console


@app.command("models")
def models_cmd(
    as_json: bool = typer.Option(False, "--json", help="Print the workloads as JSON."),
) -> None:
    """List the built-in training workloads (random weights, synthetic data)."""
    from ..workloads import COMMON_KNOBS, list_workloads  # imports torch: only when asked

    specs = list_workloads()
    if as_json:
        typer.echo(json.dumps([spec.to_dict() for spec in specs], indent=2))
        return
    table = Table(
        title="Built-in workloads",
        caption=f"Every workload also takes: {', '.join(COMMON_KNOBS)} (dtype: fp32 | bf16).",
        show_lines=True,
    )
    table.add_column("Workload", style="bold cyan", no_wrap=True)
    table.add_column("Description", ratio=3, overflow="fold")
    table.add_column("Knobs (defaults)", ratio=2)
    for spec in specs:
        knobs = []
        for knob in spec.knobs:
            text = f"{knob}={spec.defaults[knob]}"
            if knob == "image_size" and spec.min_image_size is not None:
                text += f" (>= {spec.min_image_size})"
            knobs.append(text)
        table.add_row(spec.name, f"{spec.description}; per batch: {spec.item}", "\n".join(knobs))
    console.print(table)

"""``profilednn models``: the built-in training workloads, their defaults and knobs."""

from __future__ import annotations

import json

import typer

from .app import app, console


@app.command("models")
def models_cmd(
    as_json: bool = typer.Option(False, "--json", help="Print the workloads as JSON."),
) -> None:
    """List the built-in training workloads (random weights, synthetic data)."""
    from ..workloads.api import COMMON_KNOBS, list_workloads  # imports torch: only when asked
    from ..workloads.terminal import print_workloads

    specs = list_workloads()
    if as_json:
        typer.echo(json.dumps([spec.to_dict() for spec in specs], indent=2))
        return
    print_workloads(specs, COMMON_KNOBS, console)

"""The workloads job's terminal printer: the table of ``profilednn models``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.table import Table

if TYPE_CHECKING:
    from rich.console import Console

    from .base import WorkloadSpec


def print_workloads(specs: Sequence[WorkloadSpec], common_knobs: Sequence[str], console: Console) -> None:
    """One row per built-in workload: name, description, knobs with their defaults."""
    table = Table(
        title="Built-in workloads",
        caption=f"Every workload also takes: {', '.join(common_knobs)} (dtype: fp32 | bf16).",
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


__all__ = ["print_workloads"]

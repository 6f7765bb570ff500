"""The capture job's terminal printer: the per-layer table ``profilednn profile`` and
``demo`` print after a Run is captured."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from ..formatting import styled
from ..step_summary import fwd_bwd_by_layer, step_stats
from ..tables import LAYERS, PHASES, STEPS
from ..vocabulary import PSEUDO_MODULES

if TYPE_CHECKING:
    from rich.console import Console

    from ..run import Run



def common_scope(names: list[str]) -> str:
    """The dotted prefix every name shares (``trainable_module.`` when a task module wraps the
    model, ``module.`` under DDP), "" when there is none: the table prints the rest."""
    if len(names) < 2:
        return ""
    parts = [name.split(".") for name in names]
    shared: list[str] = []
    for level in zip(*(p[:-1] for p in parts)):  # never a whole name
        if len(set(level)) != 1:
            break
        shared.append(level[0])
    return "".join(f"{p}." for p in shared)


def print_layer_table(run: Run, console: Console, top: int = 25) -> bool:
    """The per-layer forward/backward table, then loss, optimizer and data time, the step
    line and the Run's notes. False (nothing printed) when no complete step was captured."""
    steps = run.steps if run.has_table(STEPS) else None
    stats = step_stats(steps) if steps is not None else {}
    if not stats or not run.has_table(LAYERS):
        return False
    n = steps.height
    mean_ms = stats["mean_ms"]
    mods = fwd_bwd_by_layer(run.layers, n)
    scope = common_scope(mods["module"].to_list())
    under = f" of {scope[:-1]}" if scope else ""
    table = Table(title=f"{run.workload.get('name', run.id)}: per layer{under}, mean of {n} steps",
                  title_justify="left")
    for col, just in (("layer", "left"), ("type", "left"), ("forward ms", "right"),
                      ("backward ms", "right"), ("total ms", "right"), ("share", "right")):
        text = just == "left"  # names fold onto more lines in a narrow terminal; numbers never
        table.add_column(col, justify=just, overflow="fold", no_wrap=not text)  # type: ignore[arg-type]

    def share(ms: float) -> str:
        return f"{ms / mean_ms * 100:5.1f}%" if mean_ms > 0 else ""

    for r in mods.head(top).iter_rows(named=True):
        table.add_row(r["module"][len(scope):], r["module_type"] or "", f"{r['forward_ms']:.2f}",
                      f"{r['backward_ms']:.2f}", f"{r['total_ms']:.2f}", share(r["total_ms"]))
    if mods.height > top:
        rest = mods.slice(top)
        total = float(rest["total_ms"].sum())
        table.add_row(f"... {rest.height} more layers", "", f"{rest['forward_ms'].sum():.2f}",
                      f"{rest['backward_ms'].sum():.2f}", f"{total:.2f}", share(total))
    table.add_section()
    phase_ms = {ph: float(steps[f"{ph}_ms"].mean()) for ph in PHASES
                if ph != "other" and f"{ph}_ms" in steps.columns}
    for ph in PSEUDO_MODULES:  # phases that are no layer's, shown under the layers
        if ph in phase_ms:
            table.add_row(ph, "(phase)", "", "", f"{phase_ms[ph]:.2f}", share(phase_ms[ph]))
    console.print(table)
    console.print(
        f"step: median {stats['median_ms']:.1f} ms (min {stats['min_ms']:.1f}, max {stats['max_ms']:.1f}) · "
        + " · ".join(f"{ph} {ms:.1f}" for ph, ms in phase_ms.items()) + " ms"
    )
    for note in run.manifest.get("notes") or []:
        console.print(styled("note:", "yellow", f" {note}"), highlight=False)
    return True


__all__ = ["common_scope", "print_layer_table"]

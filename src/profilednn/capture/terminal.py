"""The capture job's terminal printer: the per-layer table ``profilednn profile`` and
``demo`` print after a Run is captured."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from ..formatting import styled
from ..step_summary import fwd_bwd_by_layer, layer_inflation, ranked_by_light, step_stats
from ..tables import LAYER_REFERENCE, LAYERS, PHASES, STEPS
from ..vocabulary import PSEUDO_MODULES

if TYPE_CHECKING:
    import polars as pl
    from rich.console import Console

    from ..run import Run

INFLATED_MARK = "*"


def light_cells(inflation: pl.DataFrame | None) -> dict[str, str] | None:
    """Per layer, its ``light`` cell: the median over the light reference steps, marked
    ``INFLATED_MARK`` where the full capture inflated it (None: the Run has no reference)."""
    if inflation is None:
        return None
    cells: dict[str, str] = {}
    for r in inflation.iter_rows(named=True):
        if r["light_ms"] is not None:
            cells[r["module"]] = f"{r['light_ms']:.2f}" + (INFLATED_MARK if r["inflated"] else "")
    return cells


def _light_total(cells: dict[str, str], modules: pl.Series) -> str:
    """The ``light`` cell of the layers folded into one row: their sum."""
    values = [float(cells[m].rstrip(INFLATED_MARK)) for m in modules if m in cells]
    return f"{sum(values):.2f}" if values else ""


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
    inflation = (layer_inflation(run.layers, run.table(LAYER_REFERENCE), stats["median_ms"])
                 if run.has_table(LAYER_REFERENCE) else None)
    if inflation is not None:
        mods = ranked_by_light(mods, inflation)
    scope = common_scope(mods["module"].to_list())
    under = f" of {scope[:-1]}" if scope else ""
    light = light_cells(inflation)
    caption = (f"light: the layer's median ms a step in the light reference steps (no torch.profiler), "
               f"which ranks the layers; {INFLATED_MARK}: inflated by the full capture"
               if light is not None else None)
    table = Table(title=f"{run.workload.get('name', run.id)}: per layer{under}, mean of {n} steps",
                  title_justify="left", caption=caption, caption_justify="left")
    columns = [("layer", "left"), ("type", "left"), ("forward ms", "right"), ("backward ms", "right"),
               ("total ms", "right"), ("share", "right")] + ([("light", "right")] if light is not None else [])
    for col, just in columns:
        text = just == "left"  # names fold onto more lines in a narrow terminal; numbers never
        table.add_column(col, justify=just, overflow="fold", no_wrap=not text)  # type: ignore[arg-type]

    def share(ms: float) -> str:
        return f"{ms / mean_ms * 100:5.1f}%" if mean_ms > 0 else ""

    def add(*cells: str, light_cell: str = "") -> None:
        table.add_row(*cells, *([light_cell] if light is not None else []))

    for r in mods.head(top).iter_rows(named=True):
        add(r["module"][len(scope):], r["module_type"] or "", f"{r['forward_ms']:.2f}",
            f"{r['backward_ms']:.2f}", f"{r['total_ms']:.2f}", share(r["total_ms"]),
            light_cell=(light or {}).get(r["module"], ""))
    if mods.height > top:
        rest = mods.slice(top)
        total = float(rest["total_ms"].sum())
        add(f"... {rest.height} more layers", "", f"{rest['forward_ms'].sum():.2f}",
            f"{rest['backward_ms'].sum():.2f}", f"{total:.2f}", share(total),
            light_cell=_light_total(light or {}, rest["module"]))
    table.add_section()
    phase_ms = {ph: float(steps[f"{ph}_ms"].mean()) for ph in PHASES
                if ph != "other" and f"{ph}_ms" in steps.columns}
    for ph in PSEUDO_MODULES:  # phases that are no layer's, shown under the layers
        if ph in phase_ms:
            add(ph, "(phase)", "", "", f"{phase_ms[ph]:.2f}", share(phase_ms[ph]))
    console.print(table)
    console.print(
        f"step: median {stats['median_ms']:.1f} ms (min {stats['min_ms']:.1f}, max {stats['max_ms']:.1f}) · "
        + " · ".join(f"{ph} {ms:.1f}" for ph, ms in phase_ms.items()) + " ms"
    )
    for note in run.manifest.get("notes") or []:
        console.print(styled("note:", "yellow", f" {note}"), highlight=False)
    return True


__all__ = ["INFLATED_MARK", "common_scope", "light_cells", "print_layer_table"]

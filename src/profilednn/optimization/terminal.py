"""The optimize job's terminal printer: the recipe table and the summary lines of
``profilednn optimize``.

(``report.py`` beside it holds the job's HTML section.) In a terminal narrower than
:data:`~profilednn.formatting.FULL_TABLE_WIDTH` the table keeps recipe, speedup,
numerics, accepted and why/how; ``wide=True`` (``--wide``) adds applies and the two step
times, and the numerics' loss and gradient differences.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from ..formatting import full_tables, print_table, spec, styled

if TYPE_CHECKING:
    from rich.console import Console

    from .engine import OptimizeReport, RecipeResult

_COLUMNS = (("recipe", "left"), ("applies", "left"), ("before ms", "right"), ("after ms", "right"),
            ("speedup", "right"), ("numerics", "left"), ("accepted", "left"), ("why / how", "left"))
_NARROW = ("recipe", "speedup", "numerics", "accepted", "why / how")


def _cells(r: RecipeResult, full: bool) -> dict[str, object]:
    verdict = r.numerics
    if full and r.loss_max_rel_diff is not None:
        verdict += f" (loss {r.loss_max_rel_diff:.1e}, grad {r.grad_rel_diff:.1e})"
    return {
        "recipe": r.recipe, "applies": "yes" if r.applies else "no",
        "before ms": spec(r.before_ms, ".1f"), "after ms": spec(r.after_ms, ".1f"),
        "speedup": "" if r.speedup is None else f"{r.speedup:.3f}x", "numerics": verdict,
        "accepted": styled("yes", "green") if r.accepted else "no",
        "why / how": r.decision if r.applies else r.reason,
    }


def print_recipes(report: OptimizeReport, console: Console, *, wide: bool = False) -> None:
    """One row per recipe, then the stock-vs-optimized step, MFU, headroom, launch line, notes."""
    full = full_tables(console, wide)
    table = Table(title=f"optimize {report.workload}", title_justify="left")
    columns = [(c, j) for c, j in _COLUMNS if full or c in _NARROW]
    for col, just in columns:
        table.add_column(col, justify=just, overflow="fold",  # type: ignore[arg-type]
                         ratio=3 if col == "why / how" and not full else None)
    for r in report.recipes:
        cells = _cells(r, full)
        table.add_row(*(cells[c] for c, _ in columns))  # type: ignore[arg-type]
    print_table(console, table, wide=wide)
    d = report.to_dict()
    if d["baseline"] and d["final"]:
        console.print(
            f"stock {d['baseline']['median_ms']:.1f} ms -> optimized {d['final']['median_ms']:.1f} ms "
            f"per step (median; {d.get('final_measured_in') or 'interleaved'}): {d['speedup']:.2f}x",
            soft_wrap=True, highlight=False,
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


__all__ = ["print_recipes"]

"""The optimize job's terminal printer: the recipe table and the summary lines of
``profilednn optimize`` (and of ``profilednn report`` on an optimize Run), with the
optimized step by op family (the headroom split). The speedup cell carries the sequential
test's interval (``1.142x [1.08-1.21]``; in a narrow terminal on a line of its own), the
accepted cell says "inconclusive" where the interval straddled the bar, and the totals line
is followed by the A-vs-A noise.

(``report.py`` beside it holds the job's HTML section.) In a terminal narrower than
:data:`~profilednn.formatting.FULL_TABLE_WIDTH` the table keeps recipe, speedup,
numerics, accepted and why/how; ``wide=True`` (``--wide``) adds applies and the two step
times, and the numerics' loss and gradient differences.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.table import Table

from ..formatting import full_tables, pct, print_table, spec, styled
from ..tables import OPTIMIZE_RECIPES
from .intervals import gain_interval, gain_text, noise_line, outcome, speedup_interval, speedup_text
from .partial import progress_note

if TYPE_CHECKING:
    from rich.console import Console

    from ..run import Run
    from .results import OptimizeReport

_COLUMNS = (("recipe", "left"), ("applies", "left"), ("before ms", "right"), ("after ms", "right"),
            ("speedup", "right"), ("numerics", "left"), ("accepted", "left"), ("why / how", "left"))
_NARROW = ("recipe", "speedup", "numerics", "accepted", "why / how")


def _cells(r: Mapping[str, Any], full: bool) -> dict[str, object]:
    verdict = r["numerics"]
    if full and r["loss_max_rel_diff"] is not None:
        grad = r.get("grad_rel_diff")
        verdict += f" (loss {r['loss_max_rel_diff']:.1e}" + (f", grad {grad:.1e})" if grad is not None else ")")
    return {
        "recipe": r["recipe"], "applies": "yes" if r["applies"] else "no",
        "before ms": spec(r["before_ms"], ".1f"), "after ms": spec(r["after_ms"], ".1f"),
        "speedup": speedup_text(r["speedup"], speedup_interval(r), sep=" " if full else "\n"), "numerics": verdict,
        "accepted": _accepted_cell(r), "why / how": r["decision"] if r["applies"] else r["reason"],
    }


def _accepted_cell(r: Mapping[str, Any]) -> object:
    """yes (green), inconclusive (yellow: the interval straddles the bar) or no."""
    if r["accepted"]:
        return styled("yes", "green")
    return styled("inconclusive", "yellow") if outcome(r) == "inconclusive" else "no"


def print_recipes(report: OptimizeReport, console: Console, *, wide: bool = False) -> None:
    """One row per recipe, then the stock-vs-optimized step, MFU, headroom, launch line, notes."""
    print_summary(report.workload, [r.to_dict() for r in report.recipes], report.to_dict(), console, wide=wide)


def print_summary(workload: str, recipes: Sequence[Mapping[str, Any]], d: Mapping[str, Any], console: Console,
                  *, wide: bool = False) -> None:
    """:func:`print_recipes` from plain data: the recipes as rows (``RecipeResult.to_dict()``
    or the Run's ``optimize_recipes`` rows) and the report's ``to_dict()`` (a Run's
    ``manifest["optimize"]``), so a Run prints as the verb did."""
    full = full_tables(console, wide)
    table = Table(title=f"optimize {workload}", title_justify="left")
    columns = [(c, j) for c, j in _COLUMNS if full or c in _NARROW]
    for col, just in columns:
        table.add_column(col, justify=just, overflow="fold",  # type: ignore[arg-type]
                         ratio=3 if col == "why / how" and not full else None)
    for r in recipes:
        cells = _cells(r, full)
        table.add_row(*(cells[c] for c, _ in columns))  # type: ignore[arg-type]
    print_table(console, table, wide=wide)
    print_gains(recipes, console)
    print_totals(d, console)
    if d.get("mfu_final") is not None:
        from ..hardware.dtypes import format_flops, format_peaks

        console.print(
            f"model FLOP/s: {100 * d['mfu_baseline']:.1f}% -> {100 * d['mfu_final']:.1f}% of the measured "
            f"GEMM peaks ({format_peaks(d['peak_gflops_by_dtype'], d['gemm_peak_gflops'])}, "
            f"{d.get('threads')} threads); per step: {format_flops(d['flops_by_dtype_final'] or d['flops_by_dtype'])}"
        )
        console.print(
            f"headroom: at most {d['headroom_at_peak']:.2f}x more without fewer FLOPs or a faster number "
            "format (the whole step at the GEMM peak)", soft_wrap=True, highlight=False,
        )
    if d.get("headroom"):
        print_headroom(d["headroom"], console, wide=wide)
    final = d.get("final_numerics")
    if final is not None:
        console.print(f"all accepted recipes together vs stock: numerics {final['verdict']} "
                      f"({final['detail']})", soft_wrap=True, highlight=False)
    if d.get("environment"):
        console.print(f"launch with: {d['launch_prefix']}", soft_wrap=True, highlight=False)
    print_edits(d.get("edits") or [], console)
    for note in d.get("notes") or []:
        if not note.startswith("process-level"):
            console.print(styled("note:", "yellow", f" {note}"), soft_wrap=True)


def print_totals(d: Mapping[str, Any], console: Console) -> None:
    """The stock-vs-optimized line with the total speedup's interval, then the A-vs-A noise."""
    if d.get("baseline") and d.get("final"):
        interval = speedup_interval({"speedup_ci": d.get("speedup_ci")})
        console.print(
            f"stock {d['baseline']['median_ms']:.1f} ms -> optimized {d['final']['median_ms']:.1f} ms "
            f"per step (median; {d.get('final_measured_in') or 'interleaved'}): "
            + speedup_text(d["speedup"], interval, digits=2), soft_wrap=True, highlight=False,
        )
    noise = noise_line(d.get("a_vs_a"))
    if noise:
        console.print(noise, soft_wrap=True, highlight=False)


def print_gains(recipes: Sequence[Mapping[str, Any]], console: Console) -> None:
    """Estimated (the profile's advice) against measured gain of each accepted recipe,
    where an estimate exists; the measured gain with its interval where the A/B had one."""
    pairs = [(r["recipe"], r["estimated_gain_pct"], gain_text(r.get("measured_gain_pct"), gain_interval(r)))
             for r in recipes if r.get("accepted") and r.get("estimated_gain_pct") is not None]
    if pairs:
        console.print("gain, estimated by the advice -> measured (percent of the step): "
                      + ", ".join(f"{name} {est:.1f}% -> {meas}" for name, est, meas in pairs),
                      soft_wrap=True, highlight=False)


def print_edits(edits: Sequence[str], console: Console) -> None:
    """The code edits that do by hand what the accepted recipes inject into a script."""
    if edits:
        console.print("or edit the script to the same effect:", highlight=False)
        for edit in edits:
            console.print(f"  {edit}", soft_wrap=True, highlight=False)


_HEADROOM_COLUMNS = (("family", "left"), ("ms/step", "right"), ("share", "right"), ("heaviest ops (ms/step)", "left"),
                     ("what it is", "left"))


def print_headroom(h: Mapping[str, Any], console: Console, *, wide: bool = False) -> None:
    """The optimized step by op family (``Headroom.to_dict()``): GEMM/conv with its
    efficiency, then what holds the rest; the description column with ``wide``."""
    from .op_families import DESCRIPTIONS

    eff = h.get("gemm_efficiency")
    console.print(
        f"where the optimized step goes ({h['steps_profiled']} steps under torch.profiler): GEMM/conv "
        f"{h['gemm_ms']:.2f} ms/step ({pct(_fraction(h.get('gemm_share_pct')), 0)})"
        + (f" at {pct(eff)} of the GEMM peak" if eff is not None else "")
        + f"; outside GEMM {h['outside_gemm_ms']:.2f} ms/step ({pct(_fraction(h.get('outside_gemm_pct')), 0)}):",
        soft_wrap=True, highlight=False,
    )
    full = full_tables(console, wide)
    table = Table()
    columns = [(c, j) for c, j in _HEADROOM_COLUMNS if full or c != "what it is"]
    for col, just in columns:
        table.add_column(col, justify=just, overflow="fold",  # type: ignore[arg-type]
                         no_wrap=col in ("family", "ms/step", "share"))
    for f in h.get("families") or []:
        cells = {"family": f["family"], "ms/step": f"{f['ms_per_step']:.2f}",
                 "share": pct(_fraction(f["share_pct"]), 0), "heaviest ops (ms/step)": f.get("top_ops") or "",
                 "what it is": DESCRIPTIONS.get(f["family"], "")}
        table.add_row(*(cells[c] for c, _ in columns))
    print_table(console, table, wide=wide)
    for note in h.get("notes") or []:
        console.print(f"  {note}", soft_wrap=True, highlight=False)


def _fraction(share_pct: float | None) -> float | None:
    return None if share_pct is None else share_pct / 100.0


def print_run_sections(run: Run, console: Console, *, wide: bool = False) -> bool:
    """A Run's optimize results as ``profilednn optimize`` printed them (for ``report``);
    False when the Run has none."""
    if not run.has_table(OPTIMIZE_RECIPES):
        return False
    summary = dict(run.manifest.get("optimize") or {})
    workload = summary.get("workload") or (run.manifest.get("workload") or {}).get("name") or ""
    stopped = progress_note(run.manifest)
    if stopped:
        console.print(stopped, soft_wrap=True, highlight=False)
    print_summary(workload, run.table(OPTIMIZE_RECIPES).to_dicts(), summary, console, wide=wide)
    return True


__all__ = ["print_edits", "print_gains", "print_headroom", "print_recipes", "print_run_sections", "print_summary",
           "print_totals"]

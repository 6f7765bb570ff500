"""The optimize job's section of a Run's HTML report (empty for Runs without it).

One block: the totals (stock vs optimized step in paired rounds, the speedup with its
interval; model FLOP/s as a share of the measured GEMM peak), this machine's A-vs-A noise,
the launch environment when process-level recipes won, the optimized step by op family
(``optimize_headroom``), and one row per recipe: applied or why not, outcome (accepted,
rejected, inconclusive, skipped), before/after ms, speedup and its interval, rounds,
measured gain and its interval, numerics verdict and figures, decision.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import polars as pl

from ..formatting import ms, pct
from ..hardware.dtypes import format_flops, format_peaks
from ..render.html import Section, cards, esc, table
from ..tables import OPTIMIZE_HEADROOM, OPTIMIZE_RECIPES
from .intervals import gain_interval, noise_line, outcome, speedup_interval, speedup_text
from .partial import progress_note
from .sequential import bounds_text

if TYPE_CHECKING:
    from ..run import Run

TABLE = OPTIMIZE_RECIPES.name
COLUMNS = ("recipe", "applies", "outcome", "speedup", "speedup_interval", "rounds", "before_ms", "after_ms",
           "estimated_gain_pct", "measured_gain_pct", "measured_gain_interval", "numerics", "loss_max_rel_diff",
           "grad_rel_diff", "measured_in", "reason", "decision")
HEADERS = {"estimated_gain_pct": "estimated gain % (advice)", "measured_gain_pct": "measured gain %",
           "speedup_interval": "speedup interval", "measured_gain_interval": "measured gain interval %",
           "rounds": "paired rounds",
           "loss_max_rel_diff": "loss rel diff", "grad_rel_diff": "grad rel diff",
           "before_ms": "before ms", "after_ms": "after ms", "measured_in": "measured in",
           "reason": "applied as / why not"}


def summary_cards(summary: dict[str, Any]) -> str:
    baseline, final = summary.get("baseline") or {}, summary.get("final") or {}
    speedup = summary.get("speedup")
    interval = speedup_interval({"speedup_ci": summary.get("speedup_ci")})
    peak = summary.get("gemm_peak_gflops")
    return cards([
        ("stock step (median)", ms(baseline.get("median_ms"), 1)),
        ("optimized step (median)", ms(final.get("median_ms"), 1)),
        ("speedup", speedup_text(speedup, interval, digits=2) or "n/a"),
        ("model FLOP/s of GEMM peak: stock", pct(summary.get("mfu_baseline"))),
        ("optimized", pct(summary.get("mfu_final"))),
        ("GEMM peak", format_peaks(summary.get("peak_gflops_by_dtype"), peak)),
        ("headroom at peak", "n/a" if not summary.get("headroom_at_peak")
         else f"{summary['headroom_at_peak']:.2f}x"),
        ("accepted", ", ".join(summary.get("accepted") or []) or "none"),
    ])


def headroom_block(run: "Run", headroom: dict[str, Any] | None) -> str:
    """The optimized step by op family (``optimize_headroom``); "" when it was not profiled."""
    if not run.has_table(OPTIMIZE_HEADROOM) or not headroom:
        return ""
    eff = headroom.get("gemm_efficiency")
    share = lambda v: pct(None if v is None else v / 100.0, 0)  # noqa: E731
    parts = [
        "<h3>Where the optimized step goes</h3>",
        f"<p>{headroom.get('steps_profiled')} steps of the optimized setup under torch.profiler, split by op "
        f"family: GEMM/conv {headroom['gemm_ms']:.2f} ms/step ({share(headroom.get('gemm_share_pct'))})"
        + (f", at {pct(eff)} of the GEMM peak (its model FLOPs at the measured peaks over its time)"
           if eff is not None else "")
        + f"; outside GEMM {headroom['outside_gemm_ms']:.2f} ms/step ({share(headroom.get('outside_gemm_pct'))})"
        ".</p>",
        table(run.table(OPTIMIZE_HEADROOM), ("family", "ms_per_step", "share_pct", "efficiency", "top_ops",
                                              "description"),
              headers={"ms_per_step": "ms/step", "share_pct": "share %", "efficiency": "efficiency (of peak, 0-1)",
                       "top_ops": "heaviest ops (ms/step)", "description": "what it is"}),
    ]
    parts += [f'<p class="more">{esc(n)}</p>' for n in headroom.get("notes") or []]
    return "".join(parts)


def _bounds(found: tuple[float, float] | None, digits: int, unit: str = "") -> str | None:
    return None if found is None else f"{found[0]:.{digits}f} to {found[1]:.{digits}f}{unit}"


def _speedup_bounds(found: tuple[float, float] | None) -> str | None:
    return None if found is None else bounds_text(found[0], found[1], 2, " to ") + "x"


def shown_recipes(recipes: pl.DataFrame) -> pl.DataFrame:
    """The ``optimize_recipes`` rows as the report shows them: each row's outcome and, where
    any A/B formed one (not in an older Run), its speedup interval and its measured gain's
    interval as text."""
    rows = recipes.to_dicts()
    shown = recipes.with_columns(pl.Series("outcome", [outcome(r) for r in rows], dtype=pl.Utf8))
    speedups = [_speedup_bounds(speedup_interval(r)) for r in rows]
    if not any(speedups):
        return shown
    return shown.with_columns(
        pl.Series("speedup_interval", speedups, dtype=pl.Utf8),
        pl.Series("measured_gain_interval", [_bounds(gain_interval(r), 1) for r in rows], dtype=pl.Utf8),
    )


SEQUENTIAL = (
    "timed against the current best in paired rounds, order alternating, until the speedup's interval "
    "decided: <b>accepted</b> when its lower bound cleared {bar} and its seeded loss trajectory and gradients "
    "matched the stock setup's within the stated tolerance, <b>rejected</b> when its upper bound stayed below "
    "that or the numerics failed, <b>inconclusive</b> (not kept) when its rounds or its share of the time "
    "budget ran out first. Each interval pools its A/B's rounds with this machine's A-vs-A rounds (a setup "
    "timed against itself). The totals time stock and optimized against each other the same way: ")
"""How a recipe was decided since issue 43 (``docs/optimize.md``: "How a recipe is decided")."""
MEDIANS = (
    "kept only when its median step time was at least {bar} faster in an interleaved A/B against the current "
    "best and its seeded loss trajectory and first-step gradients matched the stock setup's within the "
    "stated tolerance. The totals time stock and optimized against each other, interleaved: ")
"""How an older Run (no ``speedup_ci`` or ``a_vs_a`` in its summary) decided: on medians."""


def method_paragraph(summary: dict[str, Any]) -> str:
    """How each recipe was decided and how the totals were timed, then the A-vs-A noise."""
    bar = f"{(summary.get('settings') or {}).get('min_speedup', 1.0):.2f}x"
    sequential = "speedup_ci" in summary or "a_vs_a" in summary
    flops = summary.get("flops_per_step")
    noise = noise_line(summary.get("a_vs_a"))
    return (
        "<p>Each recipe was checked for applicability, applied to a fresh copy of the setup with "
        "the recipes accepted before it, and " + (SEQUENTIAL if sequential else MEDIANS).format(bar=bar)
        + esc(summary.get("final_measured_in") or "in one process")
        + (f"; model FLOPs per step: {flops / 1e9:,.1f} GFLOP (torch's FLOP formulas, forward + backward"
           f"; stock {format_flops(summary.get('flops_by_dtype'))}, optimized "
           f"{format_flops(summary.get('flops_by_dtype_final') or summary.get('flops_by_dtype'))}); MFU holds "
           "each dtype's FLOPs against that dtype's measured GEMM peak"
           if flops else "")
        + ".</p>"
        + (f"<p>{esc(noise)}.</p>" if noise else "")
    )


def report_sections(run: "Run") -> list[Section]:
    """The optimize section for ``run``; [] when it has no ``optimize_recipes`` table."""
    if not run.has_table(TABLE):
        return []
    recipes: pl.DataFrame = run.table(TABLE)
    summary = dict(run.manifest.get("optimize") or {})
    stopped = progress_note(run.manifest)
    parts = [f'<div class="note">{esc(stopped)}</div>'] if stopped else []
    parts.append(summary_cards(summary))
    parts.append(method_paragraph(summary))
    final = summary.get("final_numerics")
    if final:
        parts.append(f"<p>All accepted recipes together against stock: numerics <b>{esc(final['verdict'])}</b> "
                     f"({esc(final['detail'])}).</p>")
    prefix = summary.get("launch_prefix")
    if prefix:
        parts.append(f'<div class="note">Start training with <code>{esc(prefix)}</code> '
                     "(process-level recipes measured in child processes).</div>")
    parts += [f'<div class="note">{esc(n)}</div>' for n in summary.get("notes") or []
              if not str(n).startswith("process-level")]
    edits = summary.get("edits") or []
    if edits:
        parts.append("<p>Or edit the script to the same effect:</p><ul>"
                     + "".join(f"<li><code>{esc(e)}</code></li>" for e in edits) + "</ul>")
    parts.append(headroom_block(run, summary.get("headroom")))
    parts.append(table(shown_recipes(recipes), COLUMNS, headers=HEADERS))
    checked = recipes.filter(pl.col("numerics") != "not checked")
    if checked.height:
        parts.append("<h3>Numerics</h3>")
        parts.append(table(checked, ("recipe", "numerics", "tolerance", "numerics_detail", "first_step_ms"),
                           headers={"numerics_detail": "figures", "first_step_ms": "first step ms"}))
    return [Section("Optimize", "".join(parts), id="optimize")]


__all__ = ["MEDIANS", "SEQUENTIAL", "headroom_block", "method_paragraph", "report_sections", "shown_recipes"]

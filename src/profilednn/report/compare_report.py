"""The report comparing two Runs (A, the reference, and B): ratio breakdowns and
discrepancies in one HTML file, PNG charts beside it (seed 000, Fig 4)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..analysis.advice import Advice
from ..analysis.compare import Comparison
from ..analysis.facade import Analysis
from ..analysis.source import Source
from ..render.html import Section, cards, esc, figure, key_values, page, table
from ..run import atomic_write_text
from . import charts as ch
from .run_report import advice_block, charts_dir

RATIO_COLUMNS = ["a_ms", "b_ms", "ratio", "delta_ms", "a_share_pct", "b_share_pct", "contribution_pct"]


def default_output(cmp: Comparison) -> Path:
    """``RUN_B/compare_<A id>.html`` when B is a Run, else beside B's log."""
    name = f"compare_{cmp.a.id}.html"
    if cmp.b.is_log:
        return cmp.b.path.with_name(f"{cmp.b.path.stem}.compare_{cmp.a.path.stem}.html")
    return cmp.b.path / name


def headline(cmp: Comparison) -> list[tuple[str, str]]:
    s = cmp.summary()
    items = [("A (reference)", f"{cmp.a.id} ({cmp.a.workload_name})"), ("B", f"{cmp.b.id} ({cmp.b.workload_name})")]
    if s["a_step_ms"] and s["b_step_ms"]:
        items += [
            ("A step", f"{s['a_step_ms']:,.2f} ms"),
            ("B step", f"{s['b_step_ms']:,.2f} ms"),
            ("B / A step time", f"{s['step_ratio']:.2f}x"),
        ]
    if s["a_onednn_ms"] is not None and s["b_onednn_ms"] is not None:
        ratio = s["b_onednn_ms"] / s["a_onednn_ms"] if s["a_onednn_ms"] else float("nan")
        items.append(("B / A oneDNN time", f"{ratio:.2f}x"))
    return items


def compare_sections(cmp: Comparison, advice: list[Advice]) -> tuple[list[Section], list[ch.Chart]]:
    a, b = cmp.a, cmp.b
    sections: list[Section] = []
    charts: list[ch.Chart] = []

    def ratio_block(df, keys: list[str], name: str, title: str, max_rows: int = 60) -> str:
        c = ch.ratio_chart(df, keys, name, title)
        html = ""
        if c is not None:
            charts.append(c)
            html += figure(c.svg(), "Rows that changed most. Left: ms per step in A and B; right: B / A.")
        return html + table(df, [*keys, *RATIO_COLUMNS], max_rows=max_rows)

    sections.append(Section("Summary", cards(headline(cmp)) + (
        "<p>Ratios are B / A per measured step; <code>contribution_pct</code> is the part of the "
        "change in step time a row explains.</p>")))
    sections.append(Section("Advice", advice_block(advice)))
    if a.steps is not None and b.steps is not None:
        sections.append(Section("Phases", ratio_block(cmp.phases(), ["phase"], "phases", "Phases: A vs B")))
        sections.append(Section("Coverage", table(cmp.coverage(), ["component", *RATIO_COLUMNS])))
    if a.primitives is not None and b.primitives is not None:
        html = ratio_block(cmp.drivers(), ["driver"], "drivers", "oneDNN drivers: A vs B")
        html += "<h3>Driver x direction</h3>" + table(cmp.driver_directions(), ["driver", "direction", *RATIO_COLUMNS])
        sections.append(Section("oneDNN drivers", html))
    if a.ops is not None and b.ops is not None:
        sections.append(Section("Framework ops", ratio_block(cmp.ops(), ["op"], "ops", "Framework ops: A vs B")))
    if a.layers is not None and b.layers is not None:
        sections.append(Section("Layers", ratio_block(cmp.layers(), ["module", "phase"], "layers", "Layers: A vs B")))

    disc = "<h3>Call counts per step that differ</h3>" + table(cmp.call_counts())
    disc += "<h3>Present in one Run only</h3>" + table(cmp.missing())
    if a.primitives is not None and b.primitives is not None:
        disc += "<h3>Implementation or memory format changed</h3>" + table(cmp.impl_changes())
    if a.ops is not None and b.ops is not None:
        disc += (
            "<h3>Several elementwise kernels in one Run, one kernel in the other</h3>"
            + table(cmp.elementwise_splits())
        )
    sections.append(Section("Discrepancies", disc))
    fp_a, fp_b = a.fingerprint, b.fingerprint
    keys = sorted(set(fp_a) | set(fp_b))
    differ = [(k, f"A: {fp_a.get(k)} | B: {fp_b.get(k)}") for k in keys if fp_a.get(k) != fp_b.get(k)]
    sections.append(Section(
        "Fingerprints",
        (key_values(differ) if differ else "<p>Same machine and software fingerprint.</p>")
        + f"<p>A: {esc(a.path)}<br>B: {esc(b.path)}</p>",
    ))
    return sections, charts


def report_compare(
    a: Analysis | Source | str | Path,
    b: Analysis | Source | str | Path,
    output: Path | str | None = None,
    *,
    extra_sections: Sequence[Section] = (),
    advice: list[Advice] | None = None,
) -> Path:
    """Write the comparison of A (reference) and B as HTML; returns its path."""
    aa = a if isinstance(a, Analysis) else Analysis(a)
    bb = b if isinstance(b, Analysis) else Analysis(b)
    cmp = Comparison(aa, bb)
    advice = cmp.advice() if advice is None else advice
    sections, charts = compare_sections(cmp, advice)
    sections += list(extra_sections)
    out = Path(output) if output is not None else default_output(cmp)
    if out.suffix.lower() not in (".html", ".htm"):
        out = out.with_suffix(".html")
    for c in charts:
        c.save_png(charts_dir(out) / f"{c.name}.png")
    title = f"ProfileDNN comparison: {aa.id} vs {bb.id}"
    atomic_write_text(out, page(title, f"A = {aa.path}  |  B = {bb.path}", sections))
    return out

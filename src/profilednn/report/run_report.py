"""The report of one Run (or bare verbose log): HTML, PNG charts beside it, the trace.

A profile Run's report shows the profile, then the sections other jobs added. A job Run
(``job_run.py``: an optimize, memory or study Run, no profile) leads with its job's
sections and leaves out the profile sections it has no data for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from .. import step_summary
from ..analysis.advice import Advice
from ..analysis.facade import Analysis
from ..analysis.source import Source
from ..errors import RunError
from ..formatting import ms
from ..render.html import Section, cards, esc, figure, key_values, page, table, titled_table
from ..run import atomic_write_text
from . import charts as ch
from .job_run import is_job_run, no_profile_line, phases_timed
from .job_sections import job_sections
from .trace import has_timeline, write_trace


def advice_block(advice: list[Advice]) -> str:
    """The ranked advice, each with its evidence, estimated gain and action."""
    if not advice:
        return '<p>No rule fired: nothing in this profile matches a known pattern worth changing.</p>'
    out = []
    for i, a in enumerate(advice, 1):
        out.append(
            f'<div class="advice {esc(a.severity)}" data-rule="{esc(a.rule)}">'
            f'<div class="head"><span class="sev {esc(a.severity)}">{esc(a.severity)}</span>'
            f"{i}. {esc(a.rule)}<span class=\"gain\">estimated gain {a.estimated_gain_pct:.1f}%</span></div>"
            f'<div class="ev">{esc(a.evidence)}</div><div class="act">{esc(a.action)}</div></div>'
        )
    return "".join(out)


def default_output(analysis: Analysis) -> Path:
    """``RUN/report.html`` for a Run; ``NAME.report.html`` beside a log."""
    if analysis.is_log:
        return analysis.path.with_name(analysis.path.stem + ".report.html")
    return analysis.path / "report.html"


def charts_dir(html_path: Path) -> Path:
    """Where the PNG charts of ``html_path`` go: ``<stem>_charts/`` beside it."""
    return html_path.with_name(html_path.stem + "_charts")


def headline(a: Analysis, *, coverage: bool = True) -> list[tuple[str, str]]:
    """Key figures shown first: workload, status, steps, step time and (with ``coverage``)
    what oneDNN, ATen and the rest account for."""
    items = [("workload", a.workload_name), ("status", a.status)]
    stats = a.step_stats()
    if stats:
        items += [
            ("measured steps", f"{stats['steps']:.0f}"),
            ("median step", ms(stats["median_ms"], seconds=True)),
            ("spread (p10-p90)", f"{stats['p10_ms']:,.2f}-{stats['p90_ms']:,.2f} ms"),
        ]
    for r in a.coverage().iter_rows(named=True) if coverage else ():
        share = f" ({r['share_pct']:.0f}%)" if a.step_ms else ""
        items.append((r["label"], f"{r['ms_per_step']:,.2f} ms/step{share}"))
    return items


ChartFn = Callable[..., str]  # (chart or None, caption) -> the figure's HTML, the chart kept


def _summary_notes(a: Analysis, job_run: bool) -> list[str]:
    notes = list(a.manifest.get("notes") or [])
    if a.status == "failed":
        notes.insert(0, f"the workload failed: {a.manifest.get('error') or 'no error recorded'}")
    elif a.status in ("running", "interrupted"):
        notes.insert(0, f"this Run is {a.status}: its tables may be incomplete")
    elif a.status == "dead":
        notes.insert(0, "this Run is dead: the process writing it is gone (killed?) and it never "
                        "finished; its tables may be incomplete")
    if a.is_log:
        notes.append("a bare verbose log: oneDNN primitives only (no framework ops, layers or steps)")
    if job_run:
        notes.append(no_profile_line(a))
    return notes


def _step_section(a: Analysis, job_run: bool, chart: ChartFn) -> Section | None:
    if job_run and phases_timed(a.steps):
        return Section("Step", titled_table("Phases", a.by_phase())
                       + titled_table("Backward / forward ratio", a.fwd_bwd_ratio()))
    if a.steps is None or job_run:
        return None
    phases = a.by_phase()
    step_html = chart(
        ch.phase_coverage_chart(phases, a.coverage()),
        "Top: the step by phase. Bottom: oneDNN primitives, native ATen ops, and time no op accounts for.",
    )
    step_html += titled_table("Phases", phases)
    step_html += titled_table("Coverage by phase", a.coverage_by_phase())
    step_html += titled_table("Backward / forward ratio", a.fwd_bwd_ratio())
    return Section("Step", step_html)


def _primitives_section(a: Analysis, chart: ChartFn) -> Section | None:
    """oneDNN primitives (seed 000, Fig 2)."""
    if a.primitives is None or not a.primitives.height:
        return None
    dd = a.by_driver_direction()
    prim_html = chart(ch.driver_direction_chart(dd), "oneDNN primitive time by benchdnn driver and direction.")
    prim_html += titled_table(
        "By driver and direction", dd, ["driver", "direction", "calls_per_step", "ms_per_step", "share_pct"]
    )
    prim_html += titled_table(
        "By data type and implementation",
        a.by_dtype_impl(), ["driver", "cfg", "impl", "calls_per_step", "ms_per_step", "share_pct"]
    )
    prim_html += titled_table(
        "Distinct primitives",
        a.by_problem(), ["driver", "direction", "cfg", "impl", "problem", "calls_per_step", "ms_per_step", "share_pct"],
        max_rows=60,
    )
    if a.steps is None and a.ops is None:
        prim_html += titled_table("Backward / forward ratio", a.fwd_bwd_ratio())
    return Section("oneDNN primitives", prim_html)


def _ops_section(a: Analysis, chart: ChartFn) -> Section | None:
    if a.ops is None or not a.ops.height:
        return None
    ops = a.by_op()
    ops_html = chart(ch.top_ops_chart(ops), "Self time per step, split into oneDNN, native ATen and wrapper overhead.")
    ops_html += titled_table(
        "By op",
        ops, ["op", "calls_per_step", "ms_per_step", "share_pct", "onednn_ms", "native_ms", "overhead_ms", "total_ms"]
    )
    ops_html += titled_table(
        "By module type and phase", a.by_module_type(), ["module_type", "phase", "calls", "ms_per_step", "share_pct"]
    )
    return Section("Framework ops", ops_html)


def _layers_section(a: Analysis, chart: ChartFn) -> Section | None:
    if a.layers is None or not a.layers.height:
        return None
    per_layer = a.fwd_bwd_by_layer()
    inflation = a.layer_inflation()
    heaviest = "Leaf modules, heaviest first."
    if inflation is not None:
        per_layer = step_summary.ranked_by_light(per_layer, inflation)
        heaviest = ("Leaf modules, heaviest first by their light reference time (light_ms: observed "
                    "without torch.profiler, whose own cost inflates some layers).")
    layer_html = chart(ch.layer_fwd_bwd_chart(per_layer), heaviest)
    layer_html += titled_table("Forward and backward per layer", per_layer)
    if inflation is not None:
        layer_html += titled_table("The full capture against its light reference", inflation)
        layer_html += ("<p>Median ms a step of each layer in the measured steps (<code>full_ms</code>) and "
                       "in the warm-up steps observed without <code>torch.profiler</code> "
                       "(<code>light_ms</code>, <code>light_spread_ms</code>: their max - min). "
                       "<code>inflated</code>: the excess is beyond that spread and at least "
                       f"{step_summary.MATERIAL_SHARE:.0%} of the step, with at least "
                       f"{step_summary.MIN_REFERENCE_STEPS} light steps. <code>full_faults</code>, "
                       "<code>light_faults</code>: the median minor page faults a step in each; many more "
                       "in the full capture mean memory faulted in afresh under the profiler.</p>")
    layer_html += titled_table(
        "Layer x phase", a.by_layer_phase(),
        ["module", "module_type", "phase", "leaf", "calls_per_step", "ms_per_step", "share_pct", "params", "trainable_params"],
    )
    return Section("Layers", layer_html)


def _fragmentation_section(a: Analysis) -> Section | None:
    frag_html = ""
    if a.op_events is not None and a.op_events.height:
        frags = a.fragments()
        frag_html += (
            "<p>Stretches of at least 8 consecutive ops, each shorter than 0.1 ms: fusion "
            "candidates. <code>gap_ms</code> is the time between the ops (framework overhead).</p>"
        )
        frag_html += titled_table("By phase", a.fragmentation_summary())
        frag_html += titled_table(
            "Fragments",
            frags, ["step", "phase", "module", "parent", "n_ops", "span_ms", "op_ms", "gap_ms", "ops"], max_rows=50
        )
    if a.primitives is not None and a.primitives.height:
        frag_html += titled_table("Reorders", a.reorders())
        frag_html += titled_table(
            "Reorder chains",
            a.reorder_chains(), ["step", "phase", "module", "n", "time_ms", "round_trips", "path"], max_rows=50
        )
    return Section("Fragmentation", frag_html) if frag_html else None


def _fingerprint_section(a: Analysis) -> Section:
    """The machine and the capture."""
    fp = a.fingerprint
    env_html = key_values(fp.items()) if fp else "<p>No fingerprint recorded.</p>"
    m = a.manifest
    run_items = [(k, m.get(k)) for k in ("id", "created", "finished", "status", "command", "capture", "steps", "tables", "parse_report") if m.get(k) is not None]
    if a.is_log:
        run_items = [("log", str(a.path)), ("line classes", m.get("parse_report") or {})]
    env_html += "<h3>Run</h3>" + key_values(run_items)
    return Section("Fingerprint", env_html)


def run_sections(a: Analysis, advice: list[Advice], *, job_run: bool = False) -> tuple[list[Section], list[ch.Chart]]:
    """The report's sections and the charts they embed; for a ``job_run`` only those with
    data (no coverage, phases only when timed, advice only when a rule fired)."""
    charts: list[ch.Chart] = []

    def chart(c: ch.Chart | None, caption: str = "") -> str:
        if c is None:
            return ""
        charts.append(c)
        return figure(c.svg(), caption)

    summary = (cards(headline(a, coverage=not job_run))
               + "".join(f'<div class="note">{esc(n)}</div>' for n in _summary_notes(a, job_run)))
    sections = [Section("Summary", summary)]
    if advice or not job_run:
        sections.append(Section("Advice", advice_block(advice)))
    built = [_step_section(a, job_run, chart), _primitives_section(a, chart), _ops_section(a, chart),
             _layers_section(a, chart), _fragmentation_section(a), _fingerprint_section(a)]
    return sections + [sec for sec in built if sec is not None], charts


def check_reportable(a: Analysis, jobs: Sequence[Section] | None = None) -> None:
    """Raise :class:`RunError` when a Run has none of the tables a report shows.

    ``jobs``: the Run's job sections when the caller has built them already.
    """
    if a.primitives is None and a.steps is None and a.ops is None:
        if jobs is None:
            jobs = [] if a.is_log else job_sections(a.source)
        if jobs:
            return  # a job's own Run (memory, pipeline, ...): its sections are the report
        why = a.status
        if a.manifest.get("error"):
            why += f": {a.manifest['error']}"
        partial = a.path / ".verbose.log.partial"
        if a.status == "dead" and partial.is_file():
            why += (f": its process is gone; the verbose log it was writing is kept, "
                    f"`profilednn report {partial}` reads it")
        raise RunError(f"{a.path} has nothing to report: no primitives, ops or steps table (status {why})")


def report_run(
    source: Analysis | Source | str | Path,
    output: Path | str | None = None,
    *,
    extra_sections: Sequence[Section] = (),
    advice: list[Advice] | None = None,
    trace: bool = True,
) -> Path:
    """Write the HTML report of a Run or a verbose log; returns the HTML file's path.

    PNG charts go to ``<stem>_charts/`` beside the HTML; for a Run, ``RUN/trace.json``
    is written too (``trace=False`` skips it). ``extra_sections`` are appended (other
    jobs add projection or optimization results this way). A job Run's report begins
    with its job's sections.
    """
    a = source if isinstance(source, Analysis) else Analysis(source)
    jobs = [] if a.is_log else job_sections(a.source)
    check_reportable(a, jobs)
    advice = a.advice() if advice is None else advice
    job_run = bool(jobs) and is_job_run(a)
    sections, charts = run_sections(a, advice, job_run=job_run)
    sections = jobs + sections if job_run else sections + jobs
    sections += list(extra_sections)
    out = Path(output) if output is not None else default_output(a)
    if out.suffix.lower() not in (".html", ".htm"):
        out = out.with_suffix(".html")
    trace_note = ""
    if trace and not a.is_log:
        if has_timeline(a):
            trace_path = write_trace(a)
            trace_note = f"Trace: {trace_path.name} (open it in the Perfetto UI or chrome://tracing)."
        else:
            trace_note = "No trace: this Run has no spans, op events or timed primitives."
    pngs = charts_dir(out)
    for c in charts:
        c.save_png(pngs / f"{c.name}.png")
    subtitle = f"{a.workload_name} \u2014 {a.path}"
    atomic_write_text(out, page(f"ProfileDNN report: {a.id}", subtitle, sections, footer=trace_note))
    return out


__all__ = ["charts_dir", "check_reportable", "default_output", "report_run", "run_sections", "headline"]

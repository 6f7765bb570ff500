"""CLI verbs of the analysis job: ``report``, ``compare``, ``runs``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table
from rich.text import Text

from .app import app, console
from .options import writable_file

_JSON_HELP = (
    "Print the advice as a JSON list of objects (rule, severity, evidence, "
    "estimated_gain_pct, action) instead of the summary; with -o the HTML is written too."
)


def _print_json(advice) -> None:
    from ..analysis.advice import advice_json

    sys.stdout.write(json.dumps(advice_json(advice), indent=2) + "\n")
    sys.stdout.flush()


@app.command("report")
def report_cmd(
    source: Path = typer.Argument(..., help="A Run directory, or a bare oneDNN verbose log."),
    output: Optional[Path] = typer.Option(
        None, "-o", "--output", callback=writable_file,
        help="HTML file to write (default: RUN/report.html, or LOG.report.html)."
    ),
    as_json: bool = typer.Option(False, "--json", help=_JSON_HELP),
) -> None:
    """Summarize a Run (or log): breakdowns, advice, an HTML report and RUN/trace.json."""
    from ..analysis import Analysis
    from ..report import print_run_summary, report_run
    from ..report.run_report import check_reportable
    from ..report.trace import has_timeline

    from ..outputs import check_output_file
    from ..report.run_report import default_output

    analysis = Analysis(source)
    check_reportable(analysis)
    if output is None and not as_json:
        check_output_file(default_output(analysis))  # before the work, not after it
    advice = analysis.advice()
    if as_json:
        if output is not None:
            report_run(analysis, output, advice=advice)
        _print_json(advice)
        return
    print_run_summary(analysis, advice, console)
    path = report_run(analysis, output, advice=advice)
    if not analysis.is_log and has_timeline(analysis):
        console.print(f"trace: {analysis.path / 'trace.json'}", highlight=False, soft_wrap=True)
    console.print(f"report: {path}", highlight=False, soft_wrap=True)


@app.command("compare")
def compare_cmd(
    run_a: Path = typer.Argument(..., help="The reference Run (A)."),
    run_b: Path = typer.Argument(..., help="The Run to compare with it (B)."),
    output: Optional[Path] = typer.Option(
        None, "-o", "--output", callback=writable_file,
        help="HTML file to write (default: RUN_B/compare_<A id>.html)."
    ),
    as_json: bool = typer.Option(False, "--json", help=_JSON_HELP),
) -> None:
    """Compare two Runs: B/A ratio breakdowns per phase, driver, op and layer, and discrepancies."""
    from ..analysis import Analysis, Comparison
    from ..report import print_compare_summary, report_compare

    from ..outputs import check_output_file
    from ..report.compare_report import default_output

    cmp = Comparison(Analysis(run_a), Analysis(run_b))
    if output is None and not as_json:
        check_output_file(default_output(cmp))  # before the work, not after it
    advice = cmp.advice()
    if as_json:
        if output is not None:
            report_compare(cmp.a, cmp.b, output, advice=advice)
        _print_json(advice)
        return
    print_compare_summary(cmp, advice, console)
    path = report_compare(cmp.a, cmp.b, output, advice=advice)
    console.print(f"report: {path}", highlight=False, soft_wrap=True)


@app.command("runs")
def runs_cmd(
    runs_dir: Path = typer.Argument(Path("runs"), help="Directory holding Runs."),
) -> None:
    """List the Runs in RUNS_DIR with status, workload, steps and median step time."""
    from ..report.listing import list_runs

    from ..run import NotARunsDirError

    try:
        rows = list_runs(runs_dir)
    except NotARunsDirError as exc:
        raise typer.BadParameter(f"{exc} (give the directory that holds Runs)",
                                 param_hint="'RUNS_DIR'") from exc
    table = Table(title=f"Runs in {runs_dir}", title_justify="left", header_style="bold")
    for col, justify in (("directory", "left"), ("status", "left"), ("workload", "left"), ("steps", "right"),
                         ("median step ms", "right"), ("created", "left")):
        table.add_column(col, justify=justify, overflow="fold")
    style = {"complete": "green", "failed": "red", "running": "yellow", "interrupted": "yellow",
             "unreadable": "red", "damaged": "red", "dead": "red"}
    problems = []
    for r in rows.iter_rows(named=True):
        median = "" if r["median_step_ms"] is None else f"{r['median_step_ms']:,.2f}"
        name = Path(r["path"]).name
        # the directory is what a user types; the manifest id only when a copy renamed it
        label = name if r["id"] in (None, name) else f"{name} (id {r['id']})"
        table.add_row(
            label, Text(r["status"], style=style.get(r["status"], "")), r["workload"] or "",
            "" if r["steps"] is None else str(r["steps"]), median, r["created"] or "",
        )
        if r["status"] in ("unreadable", "damaged", "dead") and r["error"]:
            problems.append(f"{name}: {r['status']}: {r['error']}")
        elif r["status"] == "dead":
            problems.append(f"{name}: dead: its process is gone (killed?); it kept no tables")
    if rows.height == 0:
        console.print(f"no Runs in {runs_dir}", highlight=False)
        return
    console.print(table)
    for line in problems:
        console.print(Text.assemble(("  ! ", "red"), line), highlight=False, soft_wrap=True)

"""CLI verbs of the analysis job: ``report``, ``compare``, ``runs``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..formatting import print_json
from .app import app, console
from .options import Wide, writable_file

_JSON_HELP = (
    "Print the advice as a JSON list of objects (rule, severity, evidence, "
    "estimated_gain_pct, action) instead of the summary; with -o the HTML is written too."
)


def _print_json(advice) -> None:
    from ..analysis.api import advice_json

    print_json(advice_json(advice))


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
    from ..analysis.api import Analysis
    from ..outputs import check_output_file
    from ..report.api import check_reportable, default_report_path, has_timeline, report_run
    from ..report.terminal import print_run_summary

    analysis = Analysis(source)
    check_reportable(analysis)
    if output is None and not as_json:
        check_output_file(default_report_path(analysis))  # before the work, not after it
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
    from ..analysis.api import Analysis, Comparison
    from ..outputs import check_output_file
    from ..report.api import default_compare_path, report_compare
    from ..report.terminal import print_compare_summary

    cmp = Comparison(Analysis(run_a), Analysis(run_b))
    if output is None and not as_json:
        check_output_file(default_compare_path(cmp))  # before the work, not after it
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
    wide: Wide = False,
) -> None:
    """List the Runs in RUNS_DIR with status, steps and median step time (and workload and creation time)."""
    from ..report.api import list_runs
    from ..report.terminal import print_runs
    from ..run import NotARunsDirError

    try:
        rows = list_runs(runs_dir)
    except NotARunsDirError as exc:
        raise typer.BadParameter(f"{exc} (give the directory that holds Runs)",
                                 param_hint="'RUNS_DIR'") from exc
    print_runs(rows, runs_dir, console, wide=wide)

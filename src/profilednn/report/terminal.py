"""The report job's terminal printer (rich): a Run's or a comparison's summary (key figures,
the step, top drivers and ops, advice) and the list of Runs. A job Run (``job_run.py``)
prints its job's own tables first and none of the empty profile tables."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..analysis.advice import Advice
from ..analysis.compare import Comparison
from ..analysis.facade import Analysis
from ..formatting import fixed, full_tables, print_table
from .compare_report import headline as compare_headline
from .job_run import is_job_run, no_profile_line, phases_timed
from .run_report import headline

if TYPE_CHECKING:
    import polars as pl

SEVERITY_STYLE = {"high": "bold red", "medium": "yellow", "low": "cyan"}


def _table(title: str, df, columns: list[str], rows: int = 8) -> Table:
    t = Table(title=title, title_justify="left", show_edge=False, pad_edge=False, header_style="bold")
    for c in columns:
        numeric = df.schema[c].is_numeric() if c in df.columns else False
        t.add_column(c, justify="right" if numeric else "left", overflow="fold")
    for r in df.head(rows).iter_rows(named=True):
        t.add_row(*[fixed(r.get(c)) for c in columns])
    return t


def advice_table(advice: list[Advice]) -> Table | Text:
    if not advice:
        return Text("No advice: no rule fired.", style="green")
    t = Table(title="Advice (ranked by estimated gain)", title_justify="left", show_edge=False,
              header_style="bold", show_lines=True)
    t.add_column("#", justify="right")
    t.add_column("rule / severity")
    t.add_column("gain", justify="right")
    t.add_column("evidence and action", overflow="fold")
    for i, a in enumerate(advice, 1):
        t.add_row(
            str(i),
            Text.assemble((a.rule, "bold"), "\n", (a.severity, SEVERITY_STYLE.get(a.severity, ""))),
            f"{a.estimated_gain_pct:.1f}%",
            Text.assemble((a.evidence, "dim"), "\n", a.action),
        )
    return t


def _facts(a: Analysis, *, coverage: bool = True) -> Panel:
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column()
    for k, v in headline(a, coverage=coverage):
        facts.add_row(k, v)
    return Panel(facts, title=Text(str(a.id), style="bold"), title_align="left")


def job_run_summary(a: Analysis, advice: list[Advice]) -> Group:
    """The key figures of a job Run (no coverage), its phases when timed, advice when a
    rule fired, and one line on why the profile tables are left out."""
    parts: list = [_facts(a, coverage=False)]
    if phases_timed(a.steps):
        parts.append(_table("Phases", a.by_phase(), ["phase", "ms_per_step", "share_pct"]))
    if advice:
        parts.append(advice_table(advice))
    parts.append(Text(no_profile_line(a), style="dim"))
    return Group(*parts)


def run_summary(a: Analysis, advice: list[Advice]) -> Group:
    """A renderable summary of one Run (or log)."""
    parts: list = [_facts(a)]
    if a.steps is not None:
        parts.append(_table("Phases", a.by_phase(), ["phase", "ms_per_step", "share_pct"]))
    if a.primitives is not None and a.primitives.height:
        parts.append(_table("oneDNN by driver x direction", a.by_driver_direction(),
                            ["driver", "direction", "calls_per_step", "ms_per_step", "share_pct"], rows=6))
    if a.ops is not None and a.ops.height:
        parts.append(_table("Top framework ops (self time)", a.by_op(),
                            ["op", "calls_per_step", "ms_per_step", "share_pct"], rows=8))
    parts.append(advice_table(advice))
    return Group(*parts)


def compare_summary(cmp: Comparison, advice: list[Advice]) -> Group:
    """A renderable summary of a comparison."""
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column()
    for k, v in compare_headline(cmp):
        facts.add_row(k, v)
    parts: list = [Panel(facts, title=Text("A vs B", style="bold"), title_align="left")]
    cols = ["a_ms", "b_ms", "ratio", "contribution_pct"]
    if cmp.a.steps is not None and cmp.b.steps is not None:
        parts.append(_table("Phases (ms per step)", cmp.phases(), ["phase", *cols]))
    if cmp.a.primitives is not None and cmp.b.primitives is not None:
        parts.append(_table("oneDNN drivers (ms per step)", cmp.drivers(), ["driver", *cols], rows=6))
    if cmp.a.ops is not None and cmp.b.ops is not None:
        parts.append(_table("Ops that changed most", cmp.ops(), ["op", *cols], rows=8))
    missing = cmp.missing()
    if missing.height:
        parts.append(_table("Present in one Run only", missing, ["kind", "name", "only_in", "ms_per_step"], rows=8))
    parts.append(advice_table(advice))
    return Group(*parts)


def print_run_summary(a: Analysis, advice: list[Advice], console: Console | None = None, *,
                      wide: bool = False) -> None:
    """A profile Run's summary; a job Run's job tables (as its verb printed them) first,
    then its short summary."""
    console = console or Console(markup=False)
    if not is_job_run(a):
        console.print(run_summary(a, advice))
        return
    from .job_sections import print_job_sections

    if not print_job_sections(a.source, console, wide=wide):
        console.print("(this job prints no terminal summary: see the HTML report)", highlight=False)
    console.print(job_run_summary(a, advice))


def print_compare_summary(cmp: Comparison, advice: list[Advice], console: Console | None = None) -> None:
    (console or Console(markup=False)).print(compare_summary(cmp, advice))


RUN_STATUS_STYLE = {"complete": "green", "failed": "red", "running": "yellow", "interrupted": "yellow",
                    "unreadable": "red", "damaged": "red", "dead": "red"}


RUN_COLUMNS = (("directory", "left"), ("status", "left"), ("workload", "left"), ("steps", "right"),
               ("median step ms", "right"), ("created", "left"))
RUN_WIDE_ONLY = ("workload", "created")  # the directory's name starts with the date and the label


def print_runs(rows: pl.DataFrame, runs_dir: Path, console: Console, *, wide: bool = False) -> None:
    """The Runs of ``list_runs`` as a table, then one line per Run that cannot be read. Below
    :data:`~profilednn.formatting.FULL_TABLE_WIDTH` columns the workload and the creation
    time show only with ``wide``."""
    if rows.height == 0:
        console.print(f"no Runs in {runs_dir}", highlight=False)
        return
    table = Table(title=f"Runs in {runs_dir}", title_justify="left", header_style="bold")
    full = full_tables(console, wide)
    columns = [(col, justify) for col, justify in RUN_COLUMNS if full or col not in RUN_WIDE_ONLY]
    for col, justify in columns:
        # the directory is what a user types next and the status one word: neither folds
        table.add_column(col, justify=justify, overflow="fold",  # type: ignore[arg-type]
                         no_wrap=col in ("directory", "status", "steps"))
    problems = []
    for r in rows.iter_rows(named=True):
        name = Path(r["path"]).name
        # the directory is what a user types; the manifest id only when a copy renamed it
        label = name if r["id"] in (None, name) else f"{name} (id {r['id']})"
        cells = {
            "directory": label, "status": Text(r["status"], style=RUN_STATUS_STYLE.get(r["status"], "")),
            "workload": r["workload"] or "", "steps": "" if r["steps"] is None else str(r["steps"]),
            "median step ms": fixed(r["median_step_ms"]), "created": r["created"] or "",
        }
        table.add_row(*(cells[col] for col, _ in columns))
        if r["status"] in ("unreadable", "damaged", "dead") and r["error"]:
            problems.append(f"{name}: {r['status']}: {r['error']}")
        elif r["status"] == "dead":
            problems.append(f"{name}: dead: its process is gone (killed?); it kept no tables")
    print_table(console, table, wide=wide)
    for line in problems:
        console.print(Text.assemble(("  ! ", "red"), line), highlight=False, soft_wrap=True)


__all__ = ["RUN_COLUMNS", "RUN_STATUS_STYLE", "SEVERITY_STYLE", "advice_table", "compare_summary",
           "job_run_summary", "print_compare_summary", "print_run_summary", "print_runs", "run_summary"]

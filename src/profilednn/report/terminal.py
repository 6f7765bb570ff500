"""The terminal summary (rich): key figures, the step, top drivers and ops, advice."""

from __future__ import annotations

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..analysis.advice import Advice
from ..analysis.compare import Comparison
from ..analysis.facade import Analysis
from .compare_report import headline as compare_headline
from .run_report import headline

SEVERITY_STYLE = {"high": "bold red", "medium": "yellow", "low": "cyan"}


def _f(v: object, digits: int = 2) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def _table(title: str, df, columns: list[str], rows: int = 8) -> Table:
    t = Table(title=title, title_justify="left", show_edge=False, pad_edge=False, header_style="bold")
    for c in columns:
        numeric = df.schema[c].is_numeric() if c in df.columns else False
        t.add_column(c, justify="right" if numeric else "left", overflow="fold")
    for r in df.head(rows).iter_rows(named=True):
        t.add_row(*[_f(r.get(c)) for c in columns])
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


def run_summary(a: Analysis, advice: list[Advice]) -> Group:
    """A renderable summary of one Run (or log)."""
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column()
    for k, v in headline(a):
        facts.add_row(k, v)
    parts: list = [Panel(facts, title=Text(str(a.id), style="bold"), title_align="left")]
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


def print_run_summary(a: Analysis, advice: list[Advice], console: Console | None = None) -> None:
    (console or Console(markup=False)).print(run_summary(a, advice))


def print_compare_summary(cmp: Comparison, advice: list[Advice], console: Console | None = None) -> None:
    (console or Console(markup=False)).print(compare_summary(cmp, advice))

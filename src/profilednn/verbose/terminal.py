"""The verbose job's terminal printer: the table of ``profilednn breakdown``.

(``report.py`` beside it is the parse report, not a printer.) Imports rich only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.table import Table

if TYPE_CHECKING:
    import polars as pl
    from rich.console import Console


def print_breakdown(result: pl.DataFrame, keys: Sequence[str], event: str, caption: str,
                    console: Console) -> None:
    """One row per group (calls, total ms, share, average ms), largest first, then the total."""
    table = Table(title=f"{event} time by {', '.join(keys)}", caption=caption, title_justify="left")
    for k in keys:
        table.add_column(k, overflow="fold")
    table.add_column("calls", justify="right")
    table.add_column("total ms", justify="right")
    table.add_column("share", justify="right")
    table.add_column("avg ms", justify="right")
    for row in result.iter_rows(named=True):
        table.add_row(
            *("-" if row[k] is None else str(row[k]) for k in keys),
            f"{row['ncalls']:,}", f"{row['time_ms']:,.3f}", f"{row['percent']:.1f}%", f"{row['avg_ms']:.4f}",
        )
    total_ms = float(result["time_ms"].sum())
    table.add_section()
    table.add_row("total", *([""] * (len(keys) - 1)), f"{int(result['ncalls'].sum()):,}",
                  f"{total_ms:,.3f}", "100.0%", "")
    console.print(table)


__all__ = ["print_breakdown"]

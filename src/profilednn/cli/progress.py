"""The progress bar the long verbs show on stderr while they work (gone when they finish)."""

from __future__ import annotations

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .app import err_console


def progress_bar() -> Progress:
    """Description, bar, done/total and elapsed time, on stderr, removed at the end."""
    return Progress(TextColumn("{task.description}", style="bold", markup=False), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=err_console, transient=True)


__all__ = ["progress_bar"]

"""CLI verbs of the verbose layer: ``parse`` and ``breakdown`` (registered on ``app``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer

from ..errors import InputError
from .app import app, console, err_console

# polars, rich.table and the verbose layer load inside the verbs: `profilednn --help`
# stays a typer start-up.
from .options import writable_file

FORMATS = ("parquet", "csv", "benchdnn")
_SUFFIX_FORMAT = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".batch": "benchdnn", ".txt": "benchdnn"}
_PROGRESS_MIN_BYTES = 64 * 2**20


def _progress_total(log: str) -> Optional[int]:
    """Bytes to read when a progress bar is worth showing (a big file, a terminal)."""
    if log == "-" or not err_console.is_terminal:
        return None
    try:
        size = os.path.getsize(log)
        with open(log, "rb") as fh:
            gzipped = fh.read(2) == b"\x1f\x8b"  # progress counts uncompressed bytes
    except OSError:
        return None
    return size if size >= _PROGRESS_MIN_BYTES and not gzipped else None


def _scan(log: str, timestamps: bool = True, totals: bool = False):
    """Parse LOG with a progress bar for big files; the VerboseLog (``totals``: only the
    per-shape totals a breakdown needs, a LogTotals)."""
    def parse(progress=None):
        if totals:  # without polars where the one-pass totals apply
            from ..verbose.api import scan_totals

            return scan_totals(log, progress=progress)
        from ..verbose.api import scan_log

        return scan_log(log, progress=progress, timestamps=timestamps)

    total = _progress_total(log)
    if total is None:
        return parse()
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    with Progress(
        "[progress.description]{task.description}", BarColumn(), DownloadColumn(), TimeRemainingColumn(),
        console=err_console, transient=True,
    ) as bar:
        task = bar.add_task(f"parsing {Path(log).name}", total=total)
        return parse(lambda n: bar.advance(task, n))


def _require_primitives(parsed) -> None:
    from ..verbose.api import no_primitives_error

    if parsed.events.is_empty():
        raise no_primitives_error(parsed)


def _write_table(table, out: Path, fmt: str) -> None:
    from ..run import atomic_target

    with atomic_target(out) as tmp:
        if fmt == "parquet":
            table.write_parquet(tmp)
        else:
            table.write_csv(tmp)


@app.command("parse")
def parse_cmd(
    log: str = typer.Argument(..., help="oneDNN verbose log (plain or gzip); '-' reads stdin."),
    out: Optional[Path] = typer.Option(None, "-o", "--out", callback=writable_file,
                                       help="Output file (default: stdout for csv/benchdnn)."),
    fmt: Optional[str] = typer.Option(
        None, "--format", "-f", help="parquet | csv | benchdnn (default: from OUT's suffix, else csv)."
    ),
    event: str = typer.Option("exec", "--event", help="benchdnn format only: exec | create | all."),
) -> None:
    """Parse a verbose log into the primitive table (or a benchdnn batch file)."""
    if fmt is None:
        fmt = _SUFFIX_FORMAT.get(out.suffix.lower(), "parquet") if out is not None else "csv"
    if fmt not in FORMATS:
        raise typer.BadParameter(f"must be one of {', '.join(FORMATS)}", param_hint="--format")
    if event not in ("exec", "create", "all"):
        raise typer.BadParameter("must be exec, create or all", param_hint="--event")
    if fmt == "parquet" and out is None:
        raise typer.BadParameter("parquet needs an output file (-o OUT)", param_hint="--format")
    from ..run import atomic_write_text
    from ..verbose.api import batch_lines, format_batch

    parsed = _scan(log)
    _require_primitives(parsed)
    try:
        if fmt == "benchdnn":
            text = format_batch(batch_lines(parsed, event))
            if out is None:
                sys.stdout.write(text)
            else:
                atomic_write_text(out, text)
        else:
            table = parsed.table()
            if out is None:
                table.write_csv(sys.stdout)
            else:
                _write_table(table, out, fmt)
    except OSError as exc:
        raise InputError(f"cannot write {out or 'stdout'}: {exc.strerror or exc}") from None
    err_console.print(parsed.report.summary(), highlight=False, soft_wrap=True)


def _load_for_breakdown(log: str):
    """Per-shape totals of a log (LogTotals), or the table of a Parquet file written by ``parse``."""
    lower = log.lower()
    if lower.endswith((".parquet", ".pq")):
        import polars as pl

        try:
            return pl.read_parquet(log), None
        except Exception as exc:  # polars/pyarrow raise many kinds
            raise InputError(f"cannot read {log}: {exc}") from None
    parsed = _scan(log, timestamps=False, totals=True)  # per-shape totals: no per-line table
    if parsed.is_empty():
        from ..verbose.api import no_primitives_error

        raise no_primitives_error(parsed)
    return parsed, parsed.report


@app.command("breakdown")
def breakdown_cmd(
    log: str = typer.Argument(..., help="Verbose log ('-' for stdin) or a table from `profilednn parse`."),
    by: str = typer.Option("driver,direction", "--by", help="Columns to group by, comma-separated."),
    event: str = typer.Option("exec", "--event", help="exec | create | all"),
    csv: bool = typer.Option(False, "--csv", help="Print CSV: <keys>,ncalls,time_ms,percent,avg_ms."),
) -> None:
    """Calls, total time, share and average per group, largest first."""
    # polars loads only for a table or the terminal view: `--csv` of a log runs without it
    from ..verbose.api import breakdown, breakdown_csv, check_keys

    try:
        keys = check_keys(by.split(","))
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--by") from None
    if event not in ("exec", "create", "all"):
        raise typer.BadParameter("must be exec, create or all", param_hint="--event")
    data, report = _load_for_breakdown(log)
    try:
        if csv:
            text = breakdown_csv(data, keys, event)
            empty = text is None
        else:
            result = breakdown(data, keys, event)
            empty = result.is_empty()
    except ValueError as exc:  # a table without a key column; a per-line key on a log
        raise InputError(f"{log}: {exc}") from None
    if empty:
        raise InputError(f"no {event} primitive line in {log}")
    if csv:
        sys.stdout.write(text)
    else:
        from ..verbose.terminal import print_breakdown

        print_breakdown(result, keys, event, log, console)
    if report is not None:
        err_console.print(report.summary(), highlight=False, soft_wrap=True)

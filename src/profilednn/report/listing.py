"""The Runs of a directory as a table: id, status, workload, steps, step time, created, path."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from ..errors import ProfileDNNError
from ..run import DEFAULT_RUNS_DIR, Run, iter_runs
from ..tables import STEPS

LISTING_SCHEMA: dict[str, pl.DataType] = {
    "id": pl.Utf8,
    "status": pl.Utf8,
    "workload": pl.Utf8,
    "steps": pl.Int64,
    "median_step_ms": pl.Float64,
    "created": pl.Utf8,
    "path": pl.Utf8,
    "error": pl.Utf8,
}


def list_runs(runs_dir: Path | str = DEFAULT_RUNS_DIR) -> pl.DataFrame:
    """One row per Run, oldest first; nothing wrong inside a Run drops it from the list.

    ``status`` is the manifest's, except ``dead`` (running, but its process is gone),
    ``unreadable`` (the manifest cannot be read) and ``damaged`` (a table the manifest
    lists is missing or unreadable); ``error`` says why.
    """
    rows = []
    for run in iter_runs(runs_dir):
        try:
            rows.append(_row(run))
        except Exception as exc:  # a malformed manifest field: list the Run as unreadable
            rows.append({**dict.fromkeys(LISTING_SCHEMA), "id": run.path.name, "status": "unreadable",
                         "path": str(run.path), "error": f"{type(exc).__name__}: {exc}"})
    return pl.DataFrame(rows, schema=LISTING_SCHEMA)


def _row(run: Run) -> dict[str, object]:
    status = run.status
    median, error = None, run.manifest.get("error")
    if status != "unreadable":
        missing = run.missing_tables()
        if missing:
            status, error = "damaged", f"missing table(s): {', '.join(f'{m}.parquet' for m in missing)}"
        elif run.has_table(STEPS):
            try:
                steps = run.table(STEPS)
                if "time_ms" in steps.columns and steps.height:
                    median = float(steps["time_ms"].median())
            except ProfileDNNError as exc:
                status, error = "damaged", str(exc)
    wl = run.manifest.get("workload") or {}
    steps_n = run.manifest.get("steps")
    return {
        "id": str(run.id),
        "status": status,
        "workload": str(wl.get("name")) if isinstance(wl, dict) and wl.get("name") is not None
        else (None if isinstance(wl, dict) else str(wl)),
        "steps": int(steps_n) if isinstance(steps_n, (int, float)) and not isinstance(steps_n, bool) else None,
        "median_step_ms": median,
        "created": None if run.manifest.get("created") is None else str(run.manifest.get("created")),
        "path": str(run.path),
        "error": None if error is None else str(error),
    }

"""The Runs of a directory as a table: id, status, workload, steps, step time, created."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from ..errors import ProfileDNNError
from ..run import DEFAULT_RUNS_DIR, iter_runs

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
    """One row per Run, oldest first; unreadable Runs are listed with their error."""
    rows = []
    for run in iter_runs(runs_dir):
        median, error = None, run.manifest.get("error")
        if run.status != "unreadable" and run.has_table("steps"):
            try:
                steps = run.table("steps")
                if "time_ms" in steps.columns and steps.height:
                    median = float(steps["time_ms"].median())
            except ProfileDNNError as exc:
                error = str(exc)
        wl = run.manifest.get("workload") or {}
        steps_n = run.manifest.get("steps")
        rows.append({
            "id": run.id,
            "status": run.status,
            "workload": wl.get("name") if isinstance(wl, dict) else str(wl),
            "steps": int(steps_n) if isinstance(steps_n, (int, float)) else None,
            "median_step_ms": median,
            "created": run.manifest.get("created"),
            "path": str(run.path),
            "error": None if error is None else str(error),
        })
    return pl.DataFrame(rows, schema=LISTING_SCHEMA)

"""Shared helpers for the verbose-layer tests."""

from __future__ import annotations

from pathlib import Path

import polars as pl

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "verbose"


def row_at(df: pl.DataFrame, line: int) -> dict:
    """The table row parsed from physical line ``line`` of the log."""
    rows = df.filter(pl.col("line") == line).to_dicts()
    assert len(rows) == 1, f"expected one row for line {line}, got {len(rows)}"
    return rows[0]

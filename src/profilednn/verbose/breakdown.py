"""Where the time went: calls, total time, share and average per group of primitives.

Seed 000's Fig. 2 breaks a model's primitive time down by driver and direction; any
table column can serve as a key. Works on the full primitive table or, without ever
building it, on a :class:`~profilednn.verbose.reader.VerboseLog` (per-shape totals
first, then grouped), which keeps memory small for gigabyte logs.
"""

from __future__ import annotations

from typing import Sequence, Union

import polars as pl

from .reader import VerboseLog
from .schema import PRIMITIVE_SCHEMA

DEFAULT_KEYS: tuple[str, ...] = ("driver", "direction")
EVENTS: tuple[str, ...] = ("exec", "create", "all")


def check_keys(by: Sequence[str]) -> list[str]:
    """Validate grouping keys against the primitive table's columns."""
    keys = [k.strip() for k in by if k and k.strip()]
    if not keys:
        raise ValueError("give at least one column to group by")
    unknown = [k for k in keys if k not in PRIMITIVE_SCHEMA]
    if unknown:
        raise ValueError(
            f"unknown column(s) {', '.join(unknown)}; choose from: {', '.join(PRIMITIVE_SCHEMA)}"
        )
    if len(set(keys)) != len(keys):
        raise ValueError(f"repeated column in {', '.join(keys)}")
    return keys


def breakdown(
    data: Union[pl.DataFrame, VerboseLog],
    by: Sequence[str] = DEFAULT_KEYS,
    event: str | None = "exec",
) -> pl.DataFrame:
    """Calls and time per group, sorted by time (largest first).

    Columns: the ``by`` keys, ``ncalls``, ``time_ms``, ``percent`` (share of the total
    time of the selected events) and ``avg_ms``. ``event`` selects ``exec`` lines
    (default), every ``create`` event, or ``all``.
    """
    keys = check_keys(by)
    if event not in (None, *EVENTS):
        raise ValueError(f"event must be one of {', '.join(EVENTS)}, not {event!r}")
    if isinstance(data, VerboseLog):
        per_shape = data.shape_totals(event)
        grouped = per_shape.group_by(keys).agg(
            pl.col("ncalls").sum().cast(pl.Int64), pl.col("time_ms").sum()
        )
    else:
        missing = [k for k in (*keys, "time_ms", "event") if k not in data.columns]
        if missing:
            raise ValueError(f"table has no column(s) {', '.join(missing)}")
        rows = data.lazy()
        if event == "exec":
            rows = rows.filter(pl.col("event") == "exec")
        elif event == "create":
            rows = rows.filter(pl.col("event").str.starts_with("create"))
        grouped = rows.group_by(keys).agg(
            pl.len().cast(pl.Int64).alias("ncalls"), pl.col("time_ms").sum()
        ).collect()
    total = grouped["time_ms"].sum() if grouped.height else 0.0
    out = grouped.with_columns(
        (pl.col("time_ms") / total * 100.0 if total else pl.lit(0.0)).alias("percent"),
        (pl.col("time_ms") / pl.col("ncalls")).alias("avg_ms"),
    )
    return out.sort(["time_ms", *keys], descending=[True] + [False] * len(keys), nulls_last=True).select(
        *keys, "ncalls", "time_ms", "percent", "avg_ms"
    )

"""Where the time went: calls, total time, share and average per group of primitives.

Seed 000's Fig. 2 breaks a model's primitive time down by driver and direction; any
table column can serve as a key. Works on the full primitive table or, without ever
building it, on a :class:`~profilednn.verbose.reader.VerboseLog` or the one-pass
:class:`~profilednn.verbose.totals.LogTotals` (per-shape totals first, then grouped),
which keeps memory small for gigabyte logs.

On :class:`LogTotals` the grouping runs in plain Python over the distinct shapes
(:func:`breakdown_rows`, :func:`breakdown_csv`): ``profilednn breakdown --csv`` loads
neither polars nor NumPy. Its CSV is the text polars writes for the same table.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Sequence, Union

from .fields import FLOAT_COLUMNS, INT_COLUMNS, PER_LINE_COLUMNS, PRIMITIVE_COLUMN_NAMES
from .totals import LogTotals

if TYPE_CHECKING:
    import polars as pl

    from .reader import VerboseLog

DEFAULT_KEYS: tuple[str, ...] = ("driver", "direction")
EVENTS: tuple[str, ...] = ("exec", "create", "all")


def check_keys(by: Sequence[str]) -> list[str]:
    """Validate grouping keys against the primitive table's columns."""
    keys = [k.strip() for k in by if k and k.strip()]
    if not keys:
        raise ValueError("give at least one column to group by")
    unknown = [k for k in keys if k not in PRIMITIVE_COLUMN_NAMES]
    if unknown:
        raise ValueError(
            f"unknown column(s) {', '.join(unknown)}; choose from: {', '.join(PRIMITIVE_COLUMN_NAMES)}"
        )
    if len(set(keys)) != len(keys):
        raise ValueError(f"repeated column in {', '.join(keys)}")
    return keys


def _check_event(event: str | None) -> None:
    if event not in (None, *EVENTS):
        raise ValueError(f"event must be one of {', '.join(EVENTS)}, not {event!r}")


def _in_event(name: str, event: str | None) -> bool:
    """Whether an event name belongs to the selected family (as ``reader.filter_event``)."""
    if event in (None, "all"):
        return True
    if event == "create":
        return name.startswith("create")
    return name == event


def _typed(column: str, value: Any) -> Any:
    """A shape's value as the table's column type holds it (an int flops is a float)."""
    if value is None:
        return None
    if column in FLOAT_COLUMNS:
        return float(value)
    if column in INT_COLUMNS:
        return int(value)
    return value


def breakdown_rows(totals: LogTotals, by: Sequence[str] = DEFAULT_KEYS, event: str | None = "exec") -> list[tuple]:
    """:func:`breakdown` of per-shape totals, as plain rows: the key values, ncalls,
    time_ms, percent, avg_ms, sorted like :func:`breakdown` (time desc, then keys, nulls last)."""
    keys = check_keys(by)
    _check_event(event)
    per_line = [k for k in keys if k in PER_LINE_COLUMNS]
    if per_line:
        raise ValueError(f"cannot group per-shape totals by {', '.join(per_line)} (a value per line): "
                         "group the table `profilednn parse` writes instead")
    groups: dict[tuple, list] = {}
    for s in totals.shapes:
        if not _in_event(s.primitive.event, event):
            continue
        cols = s.primitive.columns()
        key = tuple(_typed(k, cols[k]) for k in keys)
        acc = groups.setdefault(key, [0, []])
        acc[0] += s.ncalls
        acc[1].append(s.time_ms)
    sums = {key: (n, math.fsum(times)) for key, (n, times) in groups.items()}
    total = math.fsum(t for _, t in sums.values())
    rows = [(*key, n, t, t / total * 100.0 if total else 0.0, t / n) for key, (n, t) in sums.items()]
    nk = len(keys)
    rows.sort(key=lambda r: (-r[nk + 1], *((v is None, v) for v in r[:nk])))
    return rows


def _csv_field(value: Any) -> str:
    """One CSV field as polars' ``write_csv(float_precision=6)`` writes it."""
    if value is None:
        return ""
    if isinstance(value, float):
        if value != value:
            return "NaN"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:.6f}"
    if isinstance(value, str):
        if not value or any(c in value for c in ',"\n\r'):
            return '"' + value.replace('"', '""') + '"'
        return value
    return str(value)


def breakdown_csv(
    data: Union["pl.DataFrame", "VerboseLog", LogTotals],
    by: Sequence[str] = DEFAULT_KEYS,
    event: str | None = "exec",
) -> str | None:
    """:func:`breakdown` as CSV text (``<keys>,ncalls,time_ms,percent,avg_ms``, six
    decimals), or None when no line of ``event`` is there. Per-shape totals are grouped in
    plain Python; a table or a :class:`VerboseLog` goes through polars."""
    keys = check_keys(by)
    if not isinstance(data, LogTotals):
        table = breakdown(data, keys, event)
        return table.write_csv(float_precision=6) if table.height else None
    rows = breakdown_rows(data, keys, event)
    if not rows:
        return None
    lines = [",".join(_csv_field(k) for k in (*keys, "ncalls", "time_ms", "percent", "avg_ms"))]
    lines += [",".join(_csv_field(v) for v in row) for row in rows]
    return "\n".join(lines) + "\n"


def breakdown(
    data: Union["pl.DataFrame", "VerboseLog", LogTotals],
    by: Sequence[str] = DEFAULT_KEYS,
    event: str | None = "exec",
) -> "pl.DataFrame":
    """Calls and time per group, sorted by time (largest first).

    Columns: the ``by`` keys, ``ncalls``, ``time_ms``, ``percent`` (share of the total
    time of the selected events) and ``avg_ms``. ``event`` selects ``exec`` lines
    (default), every ``create`` event, or ``all``.
    """
    import polars as pl

    from .reader import VerboseLog
    from .schema import PRIMITIVE_SCHEMA

    keys = check_keys(by)
    _check_event(event)
    if isinstance(data, LogTotals):
        schema = {**{k: PRIMITIVE_SCHEMA[k] for k in keys}, "ncalls": pl.Int64, "time_ms": pl.Float64,
                  "percent": pl.Float64, "avg_ms": pl.Float64}
        return pl.DataFrame(breakdown_rows(data, keys, event), schema=schema, orient="row")
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

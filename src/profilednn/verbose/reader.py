"""Read a verbose log into the primitive table.

The log streams through in chunks (:mod:`.source`, read into reused buffers); each
chunk is scanned (:mod:`.scan`: the C scanner, else array operations) on a small thread
pool, and every *distinct* line shape is
decoded once in Python (:mod:`.record`). What stays in memory per primitive line is a
lean row -- line number, shape id, time, timestamp -- so even a gigabyte log costs a
few hundred MB; :meth:`VerboseLog.table` joins the decoded shapes back on demand.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterable, TypeVar

import polars as pl

from ..errors import NoPrimitivesError
from .dialects import FOREIGN, MALFORMED, MARKER, PRIMITIVE
from .native_scan import kernel
from .record import KeyInfo, Primitive, decode_key
from .report import MAX_EXAMPLES, LineIssue, ParseReport
from .scan import ChunkScan, scan_chunk
from .schema import PRIMITIVE_SCHEMA, empty_primitives
from .source import DEFAULT_CHUNK_BYTES, Chunk, LogSource, describe, iter_chunks

FrameT = TypeVar("FrameT", pl.DataFrame, pl.LazyFrame)
SHAPE_ID = "shape"  # u64 id of a distinct line shape: hash of its key and header code
# Columns a shape determines (everything in the table but line, time and timestamp).
SHAPE_COLUMNS = tuple(c for c in PRIMITIVE_SCHEMA if c not in ("line", "time_ms", "timestamp_ms"))
_EVENTS_SCHEMA = {"line": pl.Int64, SHAPE_ID: pl.UInt64, "time_ms": pl.Float64, "timestamp_ms": pl.Float64}


@dataclass
class VerboseLog:
    """A parsed log: lean per-line events plus one decoded row per distinct shape.

    ``events``: line, shape, time_ms, timestamp_ms (primitive lines only, in log order);
    ``shapes``: shape and every other column of the primitive table (one row per shape);
    ``primitives``: shape id -> the decoded :class:`~profilednn.verbose.record.Primitive`.
    """

    events: pl.DataFrame
    shapes: pl.DataFrame
    report: ParseReport
    primitives: dict[int, Primitive] = field(default_factory=dict, repr=False)

    def table(self) -> pl.DataFrame:
        """The full primitive table (``PRIMITIVE_SCHEMA`` columns, log order)."""
        if self.events.is_empty():
            return empty_primitives()
        # Gather each shape column by a row index: no wide intermediate frame.
        index = self.shapes.select(SHAPE_ID).with_row_index("row")
        rows = self.events.select(SHAPE_ID).join(index, on=SHAPE_ID, how="left", maintain_order="left")["row"]
        from_shapes = self.shapes.select(
            [pl.col(c).cast(t).gather(rows) for c, t in PRIMITIVE_SCHEMA.items() if c not in self.events.columns]
        )
        table = pl.concat([self.events.select("line", "time_ms", "timestamp_ms"), from_shapes], how="horizontal")
        return table.select([pl.col(c).cast(t) for c, t in PRIMITIVE_SCHEMA.items()])

    def shape_totals(self, event: str | None = "exec") -> pl.DataFrame:
        """One row per distinct shape: its columns, ``ncalls`` and total ``time_ms``."""
        ev = self.events.group_by(SHAPE_ID).agg(
            pl.len().cast(pl.Int64).alias("ncalls"), pl.col("time_ms").sum().alias("time_ms")
        )
        out = ev.join(self.shapes, on=SHAPE_ID, how="inner")
        return filter_event(out, event)


def filter_event(df: FrameT, event: str | None) -> FrameT:
    """Rows of one event family: ``exec``, ``create`` (every ``create:*``) or all (None/"all")."""
    if event in (None, "all"):
        return df
    if event == "exec":
        return df.filter(pl.col("event") == "exec")
    if event == "create":
        return df.filter(pl.col("event").str.starts_with("create"))
    return df.filter(pl.col("event") == event)


def _prepare(chunk: Chunk, timestamps: bool = True) -> tuple[ChunkScan, pl.DataFrame, pl.DataFrame]:
    """Worker-thread part: scan a chunk, hash each line's shape, list the distinct shapes."""
    scan = scan_chunk(chunk, timestamps)
    frame = scan.frame.rename({"shape": SHAPE_ID})
    firsts = frame.group_by(SHAPE_ID).agg(
        pl.col("prefix").first(), pl.col("key_s").first(), pl.col("key_e").first(),
        pl.len().alias("n"), pl.col("line").first(),
    )
    keys = [scan.key_text(s, e) for s, e in zip(firsts["key_s"].to_list(), firsts["key_e"].to_list())]
    distinct = firsts.select(SHAPE_ID, "prefix", pl.Series("key", keys, dtype=pl.String), "n", "line")
    return scan, frame.select("line", SHAPE_ID, "time", "tlen", "ts"), distinct


def _join_decimal_comma(prim: pl.DataFrame, decimal: dict[int, int]) -> pl.DataFrame:
    """Rejoin times printed with a decimal comma: ``,9,4747`` is 9.4747 ms.

    The key holds the integer part, the last field the fraction, whose digit count
    (``tlen``) keeps leading zeros (``,0,0474`` is 0.0474). A last field that is not
    all digits is not a fraction: then the integer field is the time (an extra field).
    """
    ints = pl.DataFrame(
        {SHAPE_ID: list(decimal), "time_int": list(decimal.values())},
        schema={SHAPE_ID: pl.UInt64, "time_int": pl.Float64},
    )
    digits = pl.col("tlen").cast(pl.Int32)
    is_fraction = (
        (pl.col("time") >= 0) & (pl.col("time") == pl.col("time").floor())
        & (pl.col("time") < pl.lit(10.0).pow(digits)) & (digits > 0)
    )
    joined = prim.join(ints, on=SHAPE_ID, how="left", maintain_order="left")
    fixed = (
        pl.when(pl.col("time_int").is_null()).then(pl.col("time"))
        .when(is_fraction.fill_null(False)).then(pl.col("time_int") + pl.col("time") / pl.lit(10.0).pow(digits))
        .otherwise(pl.col("time_int"))
    )
    return joined.with_columns(fixed.alias("time")).drop("time_int")


class _Accumulator:
    """Main-thread part: decode new shapes, count classes, keep the lean primitive rows."""

    def __init__(self, report: ParseReport) -> None:
        self.report = report
        self.known: dict[int, KeyInfo] = {}
        self.prim_ids: list[int] = []
        self.prim_series: pl.Series | None = None
        self.overrides: dict[int, float] = {}  # shapes whose time sits inside the key
        self.decimal: dict[int, int] = {}      # shapes ending ``,<int>,<fraction>``: the int
        self.parts: list[pl.LazyFrame] = []
        self.next_line = 1

    def _prims(self) -> pl.Series:
        if self.prim_series is None or len(self.prim_series) != len(self.prim_ids):
            self.prim_series = pl.Series(SHAPE_ID, self.prim_ids, dtype=pl.UInt64)
        return self.prim_series

    def add(self, scan: ChunkScan, frame: pl.DataFrame, distinct: pl.DataFrame) -> None:
        r = self.report
        base = self.next_line  # line number of the chunk's first line
        self.next_line += scan.n_lines

        def text(line: int) -> str:
            return scan.line_text(line - base)

        r.lines += scan.n_lines
        r.add(FOREIGN, scan.n_foreign + scan.n_blank)
        r.add(MARKER, scan.n_marks)
        malformed_ids: list[int] = []
        with_override = with_decimal = False
        n_prim = 0  # lines of primitive shapes: when that is every line, no filter is needed
        for shape, prefix, key, n, first_index in distinct.iter_rows():
            info = self.known.get(shape)
            if info is None:
                info = decode_key(prefix, key)
                self.known[shape] = info
                if info.line_class == PRIMITIVE:
                    self.prim_ids.append(shape)
                    if info.time is not None:
                        self.overrides[shape] = info.time
                    if info.time_int is not None:
                        self.decimal[shape] = info.time_int
            if info.line_class == MALFORMED:
                malformed_ids.append(shape)
                continue
            if info.line_class == PRIMITIVE:
                n_prim += n
                with_override |= shape in self.overrides
                with_decimal |= shape in self.decimal
                if info.unknown_kind:
                    r.add_unknown_kind(info.unknown_kind, n, LineIssue(first_index + base, "unknown primitive kind",
                                                                       text(first_index + base)))
                if info.note:
                    first = first_index + base
                    r.add_note(info.note, n, LineIssue(first, info.note_detail or info.note, text(first)))
                continue  # counted below, once the time of each line is checked
            r.add(info.line_class, n)
        if malformed_ids:
            bad = frame.filter(pl.col(SHAPE_ID).is_in(pl.Series(malformed_ids, dtype=pl.UInt64).implode()))
            issues = [
                LineIssue(index + base, self.known[shape].reason or "malformed", text(index + base))
                for index, shape in bad.select("line", SHAPE_ID).head(MAX_EXAMPLES).iter_rows()
            ]
            r.add_malformed(issues, bad.height)
        if not self.prim_ids:
            return
        prim = frame if n_prim == frame.height else frame.filter(pl.col(SHAPE_ID).is_in(self._prims().implode()))
        if with_override:
            fixed = pl.DataFrame(
                {SHAPE_ID: list(self.overrides), "override": list(self.overrides.values())},
                schema={SHAPE_ID: pl.UInt64, "override": pl.Float64},
            )
            prim = prim.join(fixed, on=SHAPE_ID, how="left", maintain_order="left").with_columns(
                pl.coalesce("override", "time").alias("time")
            )
        if with_decimal:
            prim = _join_decimal_comma(prim, self.decimal)
        bad_time = pl.col("time").is_null() | ~pl.col("time").is_finite()
        n_bad = prim["time"].null_count() + int((~prim["time"].is_finite()).sum())
        no_time = prim.filter(bad_time) if n_bad else prim.clear()
        if no_time.height:
            issues = [LineIssue(i + base, "time field is missing, not a number or not finite", text(i + base))
                      for i in no_time["line"].head(MAX_EXAMPLES)]
            r.add_malformed(issues, no_time.height)
            prim = prim.filter(~bad_time)
        r.add(PRIMITIVE, prim.height)
        self.parts.append(  # collected once, all chunks together, in result()
            prim.lazy().select(
                (pl.col("line") + base).alias("line"), SHAPE_ID,
                pl.col("time").alias("time_ms"), pl.col("ts").alias("timestamp_ms"),
            )
        )

    def result(self) -> VerboseLog:
        events = pl.concat(self.parts).collect() if self.parts else pl.DataFrame(schema=_EVENTS_SCHEMA)
        rows = []
        prims = {}
        for shape, info in self.known.items():
            if info.line_class == PRIMITIVE and info.primitive is not None:
                rows.append({SHAPE_ID: shape, **info.primitive.columns()})
                prims[shape] = info.primitive
        schema = {SHAPE_ID: pl.UInt64, **{c: PRIMITIVE_SCHEMA[c] for c in SHAPE_COLUMNS}}
        shapes = pl.DataFrame(rows, schema=schema) if rows else pl.DataFrame(schema=schema)
        if events.height:
            per_shape = events.group_by(SHAPE_ID).agg(pl.len().alias("n"))
            counted = per_shape.join(shapes.select(SHAPE_ID, "dialect", "event"), on=SHAPE_ID)
            for dialect, n in counted.group_by("dialect").agg(pl.col("n").sum()).iter_rows():
                self.report.dialects[dialect] = int(n)
            for event, n in counted.group_by("event").agg(pl.col("n").sum()).iter_rows():
                self.report.events[event] = int(n)
        return VerboseLog(events, shapes, self.report, prims)


def scan_log(
    source: LogSource,
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    threads: int = 2,
    progress: Callable[[int], None] | None = None,
    timestamps: bool = True,
) -> VerboseLog:
    """Parse a log (path, ``-`` for stdin, gzip, bytes or lines) without raising on
    an empty result; see :func:`read_log` for the usual entry point.

    ``progress`` is called with the number of bytes of each chunk once it is parsed.
    ``timestamps=False`` skips parsing timestamps (``timestamp_ms`` stays null): what a
    breakdown, which never reads them, asks for.
    """
    report = ParseReport(source=describe(source))
    acc = _Accumulator(report)
    pending: deque[tuple[Chunk, Future]] = deque()
    last_newline: bool | None = None  # whether the last chunk ends with one
    buffers: list[bytearray] = []  # chunks' memory, reused once a chunk is added

    def drain_one() -> None:
        chunk, fut = pending.popleft()
        acc.add(*fut.result())
        if chunk.replaced_bytes:
            report.replaced_utf8 = True
        if progress is not None:
            progress(chunk.size)
        if isinstance(chunk.data, bytearray):
            buffers.append(chunk.data)

    kernel()  # build or load the C scan once, before the worker threads ask for it
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        for chunk in iter_chunks(source, chunk_bytes, buffers):
            pending.append((chunk, pool.submit(_prepare, chunk, timestamps)))
            last_newline = not chunk.size or chunk.data[chunk.size - 1 : chunk.size] == b"\n"
            while len(pending) > max(1, threads):
                drain_one()
        while pending:
            drain_one()
    if last_newline is False:
        report.missing_final_newline = True
    return acc.result()


def no_primitives_error(log: VerboseLog) -> NoPrimitivesError:
    """The error for a log without a oneDNN primitive line, saying what the log holds."""
    r = log.report
    if r.lines == 0:
        why = f"{r.source} is empty"
    else:
        why = f"no oneDNN primitive line in {r.source} ({r.summary()})"
        if not any(r.counts.get(c, 0) for c in ("info", "template", "dispatch", "error")):
            why += "; was it written with ONEDNN_VERBOSE=1 (or DNNL_VERBOSE=1)?"
    err = NoPrimitivesError(why)
    err.report = r  # type: ignore[attr-defined]
    return err


def read_log_with_report(
    source: LogSource | Iterable[str],
    *,
    allow_empty: bool = False,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    threads: int = 2,
) -> tuple[pl.DataFrame, ParseReport]:
    """The primitive table and the :class:`ParseReport` of what was read.

    Raises :class:`~profilednn.errors.NoPrimitivesError` when the log holds no primitive
    line, unless ``allow_empty`` (then the table is empty, with the full schema).
    """
    log = scan_log(source, chunk_bytes=chunk_bytes, threads=threads)
    if log.events.is_empty() and not allow_empty:
        raise no_primitives_error(log)
    return log.table(), log.report


def read_log(
    source: LogSource | Iterable[str],
    *,
    allow_empty: bool = False,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    threads: int = 2,
) -> pl.DataFrame:
    """Parse a oneDNN verbose log into the primitive table (``PRIMITIVE_SCHEMA``).

    ``source`` is a path (plain or gzip), ``-`` for stdin, bytes, a binary file object,
    or an iterable of lines. Every dialect from MKL-DNN 0.x to oneDNN 3.x is recognised
    per line; lines that are not primitive lines are classified and skipped (see
    :func:`read_log_with_report`). ``line`` is the 1-based physical line number.
    Raises :class:`~profilednn.errors.NoPrimitivesError` when the log holds no
    primitive line (unless ``allow_empty``) and
    :class:`~profilednn.errors.InputError` when it cannot be read.
    """
    return read_log_with_report(source, allow_empty=allow_empty, chunk_bytes=chunk_bytes, threads=threads)[0]

"""Per-shape totals of a log in one pass: what a breakdown needs, without per-line rows.

:func:`scan_totals` maps a plain log file and runs the C scan's totals function
(``pdnn_scan_totals`` in ``scan_lines.c``) over it, one byte range per thread. It splits
every verbose line exactly as the per-line scan does, but keeps per distinct line shape
only its calls, summed time and first line: no per-line frame is built. Each shape is
then decoded once (:mod:`.record`) as the reader decodes it.

The fused pass gives what :meth:`VerboseLog.shape_totals` gives (same shapes, calls and
report; times equal up to the order of float additions). Where a log needs per-line
handling it cannot do, it steps aside and the per-line reader (:func:`.reader.scan_log`)
runs instead, so the result is the same either way:

* not a plain, uncompressed file (stdin, gzip, bytes), or the C scan is unavailable
  (no compiler, ``PROFILEDNN_VERBOSE_NATIVE=0``);
* bytes that are not UTF-8 (the reader replaces them), a line over ``MAX_LINE_BYTES``;
* malformed lines (the report lists the first ones by line number), times printed with
  a decimal comma or followed by extra fields (per-line fix-ups);
* more distinct shapes than its table holds, or more odd time fields of primitive lines
  (signs, ``nan``, text) than its list holds.
"""

from __future__ import annotations

import ctypes
import os
import stat
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from .dialects import FOREIGN, MALFORMED, MARKER, PRIMITIVE
from .native_scan import totals_library
from .record import KeyInfo, Primitive, decode_key
from .report import MAX_EXAMPLES, LineIssue, ParseReport
from .source import MAX_LINE_BYTES, LogSource, describe

if TYPE_CHECKING:
    import polars as pl

SHAPE_SLOTS = 1 << 15   # hash-table slots per thread: up to half as many distinct shapes
SHAPE_SLOTS_MAX = 1 << 20  # the retry's table (~60 MB) for logs of many dynamic shapes
SLOW_CAP = 1 << 14      # time fields left to polars (signs, nan, odd text) per thread
_ISSUE_TEXT = 300       # characters of a line kept in a report example
_BAD_TIME = "time field is missing, not a number or not finite"


@dataclass
class ShapeTotal:
    """One distinct primitive shape: its decoded columns, calls and summed time."""

    shape: int
    primitive: Primitive
    ncalls: int
    time_ms: float


@dataclass
class LogTotals:
    """Calls and time per distinct primitive shape of a log, and the parse report.

    ``fused``: whether the one-pass totals scan produced it (else the per-line reader).
    """

    report: ParseReport
    fused: bool
    shapes: list[ShapeTotal] = field(default_factory=list)
    _frame: Any = field(default=None, repr=False)  # frame(), built once

    def is_empty(self) -> bool:
        """True when the log holds no primitive line."""
        return self.report.primitives == 0

    def frame(self) -> "pl.DataFrame":
        """One row per shape: ``shape``, ``ncalls``, ``time_ms`` and every shape column of the
        table (the columns of :meth:`VerboseLog.shape_totals`)."""
        if self._frame is None:
            import polars as pl

            from .reader import SHAPE_COLUMNS, SHAPE_ID
            from .schema import PRIMITIVE_SCHEMA

            schema = {SHAPE_ID: pl.UInt64, "ncalls": pl.Int64, "time_ms": pl.Float64,
                      **{c: PRIMITIVE_SCHEMA[c] for c in SHAPE_COLUMNS}}
            rows = [{SHAPE_ID: s.shape, "ncalls": s.ncalls, "time_ms": s.time_ms, **s.primitive.columns()}
                    for s in self.shapes]
            self._frame = pl.DataFrame(rows, schema=schema) if rows else pl.DataFrame(schema=schema)
        return self._frame

    def shape_totals(self, event: str | None = "exec") -> "pl.DataFrame":
        """:meth:`frame` restricted to one event family (see :func:`.reader.filter_event`)."""
        from .reader import filter_event

        return filter_event(self.frame(), event)


def scan_totals(
    source: LogSource, *, threads: int = 2, progress: Callable[[int], None] | None = None
) -> LogTotals:
    """Per-shape totals of a log (any source :func:`.reader.read_log` takes): the one
    pass over a mapped file where it applies, else the per-line reader, with the same
    result. ``progress`` is called with byte counts."""
    totals = _fused(source, max(1, threads))
    if totals is not None:
        if progress is not None:
            progress(os.path.getsize(source))  # type: ignore[arg-type]
        return totals
    import polars as pl

    from .reader import scan_log

    log = scan_log(source, threads=threads, progress=progress, timestamps=False)
    per_shape = log.events.group_by("shape").agg(pl.len(), pl.col("time_ms").sum())
    shapes = [ShapeTotal(shape, log.primitives[shape], n, t) for shape, n, t in per_shape.sort("shape").iter_rows()]
    return LogTotals(log.report, fused=False, shapes=shapes)


@dataclass
class _Range:
    """What one call of ``pdnn_scan_totals`` found in one byte range of the file."""

    start: int                      # byte offset of the range in the file
    n_shapes: int
    counts: list[int]
    shape: list[int]
    n: list[int]
    n_fast: list[int]
    time_sum: list[float]
    first: list[int]
    first_start: list[int]
    key_s: list[int]
    key_e: list[int]
    prefix: list[int]
    slow: list[tuple[int, int, int, int, int]]  # line, shape, line start, time start, line end


def _fused(source: LogSource, threads: int) -> LogTotals | None:
    """The one-pass totals, or None where the per-line reader must run (see module doc)."""
    if not isinstance(source, (str, os.PathLike)) or str(source) == "-":
        return None
    lib = totals_library()
    if lib is None:
        return None
    try:
        fd = os.open(source, os.O_RDONLY)
    except OSError:
        return None  # the reader raises the right InputError
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size == 0 or os.pread(fd, 2, 0) == b"\x1f\x8b":
            return None
        size = st.st_size
        base = lib.pdnn_map_file(fd, size)
        if not base:
            return None
        try:
            ranges = _scan_ranges(lib, base, _split(fd, size, threads))
            if ranges is None:
                return None
            ends_with_newline = ctypes.string_at(base + size - 1, 1) == b"\n"
            return _combine(ranges, base, size, describe(source), ends_with_newline)
        finally:
            lib.pdnn_unmap_file(base, size)
    finally:
        os.close(fd)


def _split(fd: int, size: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` byte ranges of the file, each ending after a newline (or at the end)."""
    cuts = [0]
    for k in range(1, parts):
        at = max(size * k // parts, cuts[-1])
        while at < size:
            block = os.pread(fd, 1 << 16, at)
            nl = block.find(b"\n")
            if nl >= 0:
                at += nl + 1
                break
            at += len(block)
        at = min(at, size)
        if at > cuts[-1]:
            cuts.append(at)
    if cuts[-1] != size:
        cuts.append(size)
    return [(a, b) for a, b in zip(cuts, cuts[1:])]


def _scan_ranges(lib: ctypes.CDLL, base: int, spans: list[tuple[int, int]]) -> list[_Range] | None:
    """Run the C totals over each span (one thread each; ctypes releases the GIL)."""
    results: list[_Range | None] = [None] * len(spans)

    def work(i: int) -> None:
        results[i] = _scan_one(lib, base, *spans[i])

    workers = [threading.Thread(target=work, args=(i,)) for i in range(1, len(spans))]
    for w in workers:
        w.start()
    work(0)
    for w in workers:
        w.join()
    if any(r is None for r in results):
        return None
    return results  # type: ignore[return-value]


def _ints(array: ctypes.Array, n: int, fmt: str) -> list:
    return memoryview(array).cast("B").cast(fmt)[:n].tolist()


def _scan_one(lib: ctypes.CDLL, base: int, start: int, end: int) -> _Range | None:
    """Scan one span; a log with more distinct shapes than ``SHAPE_SLOTS`` / 2 (many
    dynamic shapes) is scanned again with ``SHAPE_SLOTS_MAX`` slots before giving up."""
    for cap in (SHAPE_SLOTS, max(SHAPE_SLOTS, SHAPE_SLOTS_MAX)):
        done = _scan_with(lib, base, start, end, cap)
        if done is not None:
            return done
    return None


def _scan_with(lib: ctypes.CDLL, base: int, start: int, end: int, cap: int) -> _Range | None:
    i64, u64 = ctypes.c_int64 * cap, ctypes.c_uint64 * cap
    used = (ctypes.c_uint8 * cap)()
    shape, n, n_fast, first, first_start, key_s, key_e = u64(), i64(), i64(), i64(), i64(), i64(), i64()
    time_sum = (ctypes.c_double * cap)()
    prefix = (ctypes.c_int32 * cap)()
    slow_i64 = ctypes.c_int64 * SLOW_CAP
    slow_line, slow_start, slow_time, slow_end = slow_i64(), slow_i64(), slow_i64(), slow_i64()
    slow_shape = (ctypes.c_uint64 * SLOW_CAP)()
    counts = (ctypes.c_int64 * 8)()
    got = lib.pdnn_scan_totals(
        base + start, end - start, cap, used, shape, n, n_fast, time_sum, first, first_start, key_s, key_e,
        prefix, SLOW_CAP, slow_line, slow_shape, slow_start, slow_time, slow_end, counts,
    )
    if got < 0:
        return None  # more distinct shapes than the table holds
    c = list(counts)
    k = c[6]
    slow = list(zip(_ints(slow_line, k, "q"), _ints(slow_shape, k, "Q"), _ints(slow_start, k, "q"),
                    _ints(slow_time, k, "q"), _ints(slow_end, k, "q")))
    return _Range(
        start, got, c, _ints(shape, got, "Q"), _ints(n, got, "q"), _ints(n_fast, got, "q"),
        _ints(time_sum, got, "d"), _ints(first, got, "q"), _ints(first_start, got, "q"),
        _ints(key_s, got, "q"), _ints(key_e, got, "q"), _ints(prefix, got, "i"), slow,
    )


def _line_text(base: int, size: int, start: int) -> str:
    """The line starting at byte ``start`` (at most ``_ISSUE_TEXT`` bytes), for reports."""
    raw = ctypes.string_at(base + start, min(_ISSUE_TEXT, size - start))
    return raw.split(b"\n", 1)[0].rstrip(b"\r").decode("utf-8", errors="replace")


def _parse_times(texts: list[str]) -> list[float | None]:
    """Time fields the C code left alone, read by polars' cast like the per-line path."""
    import polars as pl

    return pl.Series(texts, dtype=pl.String).cast(pl.Float64, strict=False).to_list()


def _combine(ranges: list[_Range], base: int, size: int, name: str, ends_with_newline: bool) -> LogTotals | None:
    """Merge the ranges' tables, decode each shape once, and count like the reader."""
    report = ParseReport(source=name)
    # per shape: [n, n_fast, time, first line (1-based), first line's start, key_s, key_e, prefix]
    merged: dict[int, list] = {}
    line0 = 1
    slow_overflow = False
    for r in ranges:
        lines, blank, marks, foreign, invalid, longest, _, overflow = r.counts
        if invalid or longest > MAX_LINE_BYTES:
            return None
        slow_overflow |= bool(overflow)
        report.lines += lines
        report.add(FOREIGN, foreign + blank)
        report.add(MARKER, marks)
        for i in range(r.n_shapes):
            entry = merged.get(r.shape[i])
            if entry is None:
                merged[r.shape[i]] = [r.n[i], r.n_fast[i], r.time_sum[i], r.first[i] + line0,
                                      r.first_start[i] + r.start, r.key_s[i] + r.start, r.key_e[i] + r.start,
                                      r.prefix[i]]
            else:
                entry[0] += r.n[i]
                entry[1] += r.n_fast[i]
                entry[2] += r.time_sum[i]
        r.slow = [(line + line0, shape, s + r.start, t + r.start, e + r.start) for line, shape, s, t, e in r.slow]
        line0 += lines
    infos: dict[int, KeyInfo] = {}
    for shape, (_, _, _, _, _, ks, ke, prefix) in sorted(merged.items(), key=lambda kv: kv[1][3]):
        key = ctypes.string_at(base + ks, ke - ks).decode("utf-8", errors="replace")
        info = decode_key(prefix, key)
        if info.line_class == MALFORMED or (
            info.line_class == PRIMITIVE and (info.time is not None or info.time_int is not None)
        ):
            return None  # per-line work: the reader lists malformed lines and fixes such times
        infos[shape] = info
        if slow_overflow and info.line_class == PRIMITIVE and merged[shape][0] > merged[shape][1]:
            return None  # a primitive's odd time field was not listed
    slow = [s for r in ranges for s in r.slow if infos[s[1]].line_class == PRIMITIVE]
    if slow:
        texts = [ctypes.string_at(base + t, e - t).decode("utf-8", errors="replace") for _, _, _, t, e in slow]
        bad: list[LineIssue] = []
        for (line, shape, start, _, _), value in zip(slow, _parse_times(texts)):
            if value is None or value != value or value in (float("inf"), float("-inf")):
                if len(bad) < MAX_EXAMPLES:
                    bad.append(LineIssue(line, _BAD_TIME, _line_text(base, size, start)))
                report.counts[MALFORMED] = report.counts.get(MALFORMED, 0) + 1
            else:
                merged[shape][1] += 1
                merged[shape][2] += value
        report.malformed = bad
    totals = LogTotals(report, fused=True)
    for shape, info in infos.items():
        n, n_fast, time_ms, first, first_start = merged[shape][:5]
        if info.line_class != PRIMITIVE:
            report.add(info.line_class, n)
            continue
        if info.unknown_kind:
            report.add_unknown_kind(info.unknown_kind, n,
                                    LineIssue(first, "unknown primitive kind", _line_text(base, size, first_start)))
        if info.note:
            report.add_note(info.note, n, LineIssue(first, info.note_detail or info.note,
                                                    _line_text(base, size, first_start)))
        if n_fast == 0 or info.primitive is None:
            continue
        report.add(PRIMITIVE, n_fast)
        prim = info.primitive
        report.dialects[prim.dialect] = report.dialects.get(prim.dialect, 0) + n_fast
        report.events[prim.event] = report.events.get(prim.event, 0) + n_fast
        totals.shapes.append(ShapeTotal(shape, prim, n_fast, time_ms))
    report.missing_final_newline = not ends_with_newline
    return totals

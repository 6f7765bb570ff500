"""First pass over one chunk: where each verbose line's parts are.

Two implementations give the same frame: the C scan (:mod:`.native_scan`, one sweep of
the bytes, built with the system compiler where there is one) and, everywhere else, the
vectorized NumPy scan below. NumPy finds the line ends of a whole chunk at once; a few
array operations then read each line's header -- the marker and the optional ``vN``
version field and timestamp, in either order. The per-line results leave as Arrow
string *views* into the chunk's bytes, so no Python string is made per line. Per
verbose line the frame holds:

* ``prefix`` -- a small integer code: which marker, whether a ``vN`` field was present;
* ``shape``  -- a hash naming the distinct (prefix, key), where the key is the line after
  the header up to its last comma (``key_s``, ``key_e`` are its bounds): component, event
  and everything that describes the primitive (without timestamp and time), the unit of
  deduplication decoded once per distinct value by :mod:`.record`;
* ``time``   -- the last field, ``ts`` -- the timestamp field (both parsed to floats);
  ``tlen`` -- the last field's length (a decimal-comma time's fraction needs it).

Lines that do not start with a verbose marker are counted as foreign output (or as
ProfileDNN marker lines); a marker preceded by other text on the same line (e.g. a
``[rank0]:`` tag added by a launcher) is still found.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import polars as pl

from .dialects import MARKERS, PROFILEDNN_MARK, prefix_code, unpack_prefix  # noqa: F401 (re-exported)
from .native_scan import kernel, native_scan
from .source import Chunk

_COMMA, _NL, _CR = 44, 10, 13
_ANY_MARKER_RE = re.compile(rb"(?:onednn_graph|dnnl_graph|onednn|dnnl|mkldnn)_verbose,")


@dataclass
class ChunkScan:
    """What the first pass learned about one chunk."""

    # line (0-based in the chunk), prefix, shape, time, tlen, ts, key_s, key_e: one row per verbose line
    frame: pl.DataFrame
    n_lines: int
    n_blank: int
    n_marks: int              # profilednn_mark lines
    n_foreign: int            # other non-verbose, non-blank lines
    data: bytes | bytearray
    size: int
    starts: np.ndarray | None = None  # line bounds, found on demand (error reports only)
    ends: np.ndarray | None = None

    def line_text(self, index: int, limit: int = 300) -> str:
        """The text of line ``index`` (0-based) of this chunk, for error reports."""
        if self.starts is None or self.ends is None:
            self.starts, self.ends = _line_bounds(np.frombuffer(self.data, dtype=np.uint8), self.size)
        s, e = int(self.starts[index]), int(self.ends[index])
        return self.data[s : min(e, s + limit)].decode("utf-8", errors="replace")

    def key_text(self, start: int, end: int) -> str:
        """The key found at ``data[start:end]`` (valid UTF-8: the source replaced bad bytes)."""
        return self.data[start:end].decode("utf-8", errors="replace")


def _line_bounds(buf: np.ndarray, nbytes: int) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (without ``\\n`` / ``\\r\\n``) offsets of every line of ``buf[:nbytes]``."""
    nl = np.flatnonzero(buf[:nbytes] == _NL)
    if nbytes and buf[nbytes - 1] != _NL:
        nl = np.append(nl, nbytes)
    ends = nl.astype(np.int64)
    starts = np.empty_like(ends)
    if len(ends):
        starts[0] = 0
        starts[1:] = ends[:-1] + 1
    nonempty = np.flatnonzero(ends > starts)
    ends[nonempty] -= buf[ends[nonempty] - 1] == _CR
    return starts, ends


def _words(padded: bytes, dtype: str) -> np.ndarray:
    """An unaligned view: element ``i`` is the little-endian word starting at byte ``i``."""
    width = np.dtype(dtype).itemsize
    return np.ndarray(shape=(len(padded) - width + 1,), dtype=dtype, buffer=padded, strides=(1,))


def _low_bytes(word: np.ndarray, n: np.ndarray, size: int) -> np.ndarray:
    """Keep the low ``n`` bytes (0..size) of each little-endian word, zero the rest."""
    n = np.clip(n, 0, size)
    full = np.iinfo(word.dtype).max
    shift = (8 * np.minimum(n, size - 1)).astype(word.dtype)
    mask = np.where(n >= size, full, (np.ones_like(word) << shift) - 1).astype(word.dtype)
    return word & mask


def _views(u64: np.ndarray, u32: np.ndarray, data, starts: np.ndarray, ends: np.ndarray):
    """An Arrow string_view array of ``data[starts[i]:ends[i]]`` without copying the bytes."""
    import pyarrow as pa

    n = len(starts)
    if n == 0:
        return pa.array([], type=pa.string_view())
    lens = np.maximum(ends - starts, 0)
    views = np.zeros((n, 4), dtype=np.int32)
    raw = views.view(np.uint8)
    lo = _low_bytes(u64[starts], lens, 8)
    hi = _low_bytes(u32[starts + 8], lens - 8, 4)
    np.ndarray((n,), dtype="<u8", buffer=raw, offset=4, strides=(16,))[:] = lo
    views[:, 3] = hi.view(np.int32)
    views[:, 0] = lens
    long = lens > 12
    views[long, 2] = 0
    views[long, 3] = starts[long]
    return pa.Array.from_buffers(pa.string_view(), n, [None, pa.py_buffer(views), data])


def _long_views(u64: np.ndarray, u32: np.ndarray, data, starts: np.ndarray, ends: np.ndarray):
    """:func:`_views` for strings that are mostly longer than 12 bytes (keys, timestamps).

    A long string's view is its length, its first 4 bytes and its offset: one read per
    string instead of the 12 inline bytes; the few short ones go through :func:`_views`.
    """
    import pyarrow as pa

    lens = np.maximum(ends - starts, 0)
    short = np.flatnonzero(lens <= 12)
    if len(short) * 4 > len(lens):
        return _views(u64, u32, data, starts, ends)
    views = np.zeros((len(starts), 4), dtype=np.int32)
    views[:, 0] = lens
    views[:, 1] = u32[starts].view(np.int32)
    views[:, 3] = starts
    if len(short):
        fixed = _views(u64, u32, data, starts[short], ends[short])
        views[short] = np.frombuffer(fixed.buffers()[1], dtype=np.int32).reshape(-1, 4)[: len(short)]
    return pa.Array.from_buffers(pa.string_view(), len(starts), [None, pa.py_buffer(views), data])


def _word(text: bytes) -> np.uint64:
    """The first (up to) 8 bytes of ``text`` as the little-endian word a window gives."""
    return np.frombuffer(text[:8].ljust(8, b"\0"), dtype=np.uint64)[0]


def _find_markers(
    buf: np.ndarray, u64: np.ndarray, starts: np.ndarray, lens: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Marker id of each line (0 = none) and which lines are ProfileDNN marker lines.

    Compares whole 8-byte words: the first word of every line once, then the following
    words only for the lines whose first word matched.
    """
    n = len(starts)
    marker = np.zeros(n, dtype=np.int64)
    is_mark = np.zeros(n, dtype=bool)
    w0 = u64[starts]
    for text, mid in (*MARKERS, (PROFILEDNN_MARK, -1)):
        cand = np.flatnonzero((w0 == _word(text)) & (lens >= len(text)))
        for offset in range(8, len(text), 8):
            if not len(cand):
                break
            part = text[offset : offset + 8]
            mask = np.uint64((1 << (8 * len(part))) - 1) if len(part) < 8 else np.uint64(2**64 - 1)
            cand = cand[(u64[starts[cand] + offset] & mask) == _word(part)]
        if mid < 0:
            is_mark[cand] = True
        else:
            marker[cand] = mid
    return marker, is_mark


def _find_prefixed_markers(
    data: bytes, starts: np.ndarray, ends: np.ndarray, marker: np.ndarray, is_mark: np.ndarray
) -> np.ndarray:
    """Start offsets of markers found behind other text on otherwise foreign lines."""
    vstart = starts.copy()
    foreign = np.flatnonzero((marker == 0) & ~is_mark & (ends > starts))
    if not len(foreign):
        return vstart
    if len(foreign) > 20000 and data.count(b"_verbose,") <= int(np.count_nonzero(marker)):
        return vstart
    by_id = {t: mid for t, mid in MARKERS}
    for i in foreign:
        s, e = int(starts[i]), int(ends[i])
        if data.find(b"_verbose,", s, e) < 0:
            continue
        m = _ANY_MARKER_RE.search(data, s, e)
        if m:
            marker[i] = by_id[m.group(0)]
            vstart[i] = m.start()
    return vstart


_LOW7 = np.uint64(0x7F7F7F7F7F7F7F7F)
_COMMA8 = np.uint64(0x2C2C2C2C2C2C2C2C)
_SEARCH_WORDS = 4  # commas are looked for in the first/last few 8-byte words of a field


def _comma_bits(words: np.ndarray) -> np.ndarray:
    """Bit 8*i+7 of the result is set exactly where byte i of the word is a comma."""
    x = words ^ _COMMA8
    return ~(((x & _LOW7) + _LOW7) | x | _LOW7)


def _top_byte(bits: np.ndarray) -> np.ndarray:
    """Index (0-7) of the highest flagged byte of each word; -1 where none is."""
    exponent = np.frexp(bits.astype(np.float64))[1]  # flags are 8 bits apart: no rounding carry
    return np.where(bits != 0, (exponent - 1) // 8, -1)


def _first_commas(u64: np.ndarray, data: bytes, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Offset of the first comma in each ``[start, end)``; ``end`` where there is none.

    Looks at 8 bytes at a time for all rows together (a timestamp field is ~20 bytes);
    rows longer than the search run through ``bytes.find``.
    """
    out = end.copy()
    todo = np.arange(len(start))
    for k in range(_SEARCH_WORDS):
        if not len(todo):
            return out
        at0 = start[todo] + 8 * k
        bits = _comma_bits(u64[at0])
        lowest = bits & (~bits + np.uint64(1))
        at = at0 + _top_byte(lowest)
        hit = bits != 0
        take = hit & (at < end[todo])
        out[todo[take]] = at[take]
        todo = todo[~hit & (at0 + 8 < end[todo])]
    for i in todo:
        c = data.find(b",", int(start[i]), int(end[i]))
        out[i] = c if c >= 0 else end[i]
    return out


def _last_commas(u64: np.ndarray, data: bytes, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Offset of the last comma in each ``[start, end)``; -1 where there is none.

    Reads the 8-byte words that end the range (a time field is a few bytes long);
    longer fields run through ``bytes.rfind``.
    """
    out = np.full(len(end), -1, dtype=np.int64)
    todo = np.arange(len(end))
    slow = [todo[end < 8 * _SEARCH_WORDS]]  # near the chunk start: no word to read before
    todo = todo[end >= 8 * _SEARCH_WORDS]
    for k in range(1, _SEARCH_WORDS + 1):
        if not len(todo):
            break
        at0 = end[todo] - 8 * k
        bits = _comma_bits(u64[at0])
        at = at0 + _top_byte(bits)
        hit = bits != 0
        take = hit & (at >= start[todo])
        out[todo[take]] = at[take]
        todo = todo[~hit & (at0 > start[todo])]
    for i in np.concatenate([*slow, todo]):
        out[i] = data.rfind(b",", int(start[i]), int(end[i]))
    return out


def _version_len(w: np.ndarray) -> np.ndarray:
    """Length (3 or 4, 0 if none) of a ``vN,`` / ``vNN,`` field starting each 4-byte word."""
    b0, b1, b2, b3 = (((w >> np.uint32(8 * i)) & np.uint32(0xFF)) for i in range(4))
    is_v = b0 == ord("v")
    digit1 = (b1 >= 48) & (b1 <= 57)
    digit2 = (b2 >= 48) & (b2 <= 57)
    three = is_v & digit1 & (b2 == _COMMA)
    four = is_v & digit1 & digit2 & (b3 == _COMMA)
    return np.where(three, 3, np.where(four, 4, 0))


def scan_chunk(chunk: Chunk, timestamps: bool = True, native: bool = True) -> ChunkScan:
    """Locate the key, time and timestamp of every verbose line of a chunk.

    ``timestamps=False`` leaves ``ts`` null (a breakdown never reads it): the field is
    still found, since the key starts after it, but not parsed. The C scan
    (:mod:`.native_scan`) runs where it could be built, unless ``native=False``; the
    NumPy scan below gives the same frame.
    """
    fn = kernel() if native else None
    if fn is not None:
        frame, (n_lines, n_blank, n_marks, n_foreign) = native_scan(fn, chunk.data, chunk.size, timestamps)
        return ChunkScan(frame, n_lines, n_blank, n_marks, n_foreign, chunk.data, chunk.size)
    return numpy_scan_chunk(chunk, timestamps)


def numpy_scan_chunk(chunk: Chunk, timestamps: bool = True) -> ChunkScan:
    """:func:`scan_chunk` with NumPy array operations only (no compiler needed)."""
    import pyarrow as pa

    padded = chunk.data
    buf = np.frombuffer(padded, dtype=np.uint8)
    nbytes = chunk.size
    starts, ends = _line_bounds(buf, nbytes)
    lens = ends - starts
    n_lines = len(ends)

    u64, u32 = _words(padded, "<u8"), _words(padded, "<u4")
    marker, is_mark = _find_markers(buf, u64, starts, lens)
    vstart = _find_prefixed_markers(padded, starts, ends, marker, is_mark)

    n_blank = int(np.count_nonzero(lens == 0))
    n_marks = int(np.count_nonzero(is_mark))
    vidx = np.flatnonzero(marker)
    n_foreign = n_lines - len(vidx) - n_blank - n_marks

    marker_len = np.zeros(6, dtype=np.int64)
    for text, mid in MARKERS:
        marker_len[mid] = len(text)
    v_marker = marker[vidx]
    v_end = ends[vidx]
    p = vstart[vidx] + marker_len[v_marker]

    # Header: [vN,] [timestamp,] [vN,] -- the rest (component, event, body) is the key.
    ver = _version_len(u32[p])
    ver = np.where(p + ver <= v_end, ver, 0)
    q = p + ver
    first = buf[q]
    is_ts = (q < v_end) & (first >= 48) & (first <= 57)
    ts_e = v_end.copy()
    with_ts = np.flatnonzero(is_ts)
    ts_e[with_ts] = _first_commas(u64, padded, q[with_ts], v_end[with_ts])
    r = np.where(is_ts, np.minimum(ts_e + 1, v_end), q)
    late = _version_len(u32[r]) * ((ver == 0) & is_ts)
    late = np.where(r + late <= v_end, late, 0)
    has_ver = (ver > 0) | (late > 0)
    key_s = r + late

    last = _last_commas(u64, padded, key_s, v_end)
    has_tail = last >= 0
    key_e = np.where(has_tail, last, v_end)
    time_s = np.where(has_tail, last + 1, v_end)

    arrow_data = pa.py_buffer(padded)
    nv = len(vidx)
    prefix = prefix_code(v_marker, has_ver.astype(np.int64))
    key = pl.from_arrow(_long_views(u64, u32, arrow_data, key_s, key_e))
    time = pl.from_arrow(_views(u64, u32, arrow_data, time_s, v_end)).cast(pl.Float64, strict=False)
    ts_values = np.full(nv, np.nan)
    if len(with_ts) and timestamps:
        parsed = pl.from_arrow(_long_views(u64, u32, arrow_data, q[with_ts], ts_e[with_ts]))
        ts_values[with_ts] = parsed.cast(pl.Float64, strict=False).to_numpy()  # null -> NaN
    ts = pl.Series(values=ts_values).fill_nan(None)
    prefix = prefix.astype(np.int32)
    frame = pl.DataFrame(
        {
            "line": vidx.astype(np.int64),  # 0-based within the chunk; the reader adds the offset
            "prefix": prefix,
            "shape": key.hash() ^ pl.Series(prefix).cast(pl.UInt64),  # names a distinct (prefix, key)
            "time": time,
            "tlen": np.minimum(v_end - time_s, 127).astype(np.int8),  # digits of a decimal-comma fraction
            "ts": ts,
            "key_s": key_s.astype(np.int64),
            "key_e": key_e.astype(np.int64),
        }
    )
    return ChunkScan(frame, n_lines, n_blank, n_marks, n_foreign, padded, nbytes, starts, ends)

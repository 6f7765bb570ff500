"""Vectorized first pass over one chunk: where each verbose line's parts are.

NumPy finds the line ends and commas of a whole chunk at once; a few array operations
then read each line's header -- the marker and the optional ``vN`` version field and
timestamp, in either order. The per-line results leave as Arrow string *views* into the
chunk's bytes, so no Python string is made per line:

* ``prefix`` -- a small integer code: which marker, whether a ``vN`` field was present;
* ``key``    -- the line after the header up to its last comma: component, event and
  everything that describes the primitive (without timestamp and time), the unit of
  deduplication decoded once per distinct value by :mod:`.record`;
* ``time``   -- the last field, ``ts`` -- the timestamp field (both parsed to floats).

Lines that do not start with a verbose marker are counted as foreign output (or as
ProfileDNN marker lines); a marker preceded by other text on the same line (e.g. a
``[rank0]:`` tag added by a launcher) is still found.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa

from .dialects import MARKERS, PROFILEDNN_MARK
from .source import Chunk

_COMMA, _NL, _CR = 44, 10, 13
_ANY_MARKER_RE = re.compile(rb"(?:onednn_graph|dnnl_graph|onednn|dnnl|mkldnn)_verbose,")


def prefix_code(marker, has_version):  # ints or NumPy arrays
    """Pack the header facts the key does not keep (marker, ``vN`` field) into one int."""
    return marker * 100 + has_version * 10


def unpack_prefix(code: int) -> tuple[int, bool]:
    return code // 100, bool((code // 10) % 10)


@dataclass
class ChunkScan:
    """What the first pass learned about one chunk."""

    frame: pl.DataFrame       # line (0-based in the chunk), prefix, key, time, ts: one row per verbose line
    n_lines: int
    n_blank: int
    n_marks: int              # profilednn_mark lines
    n_foreign: int            # other non-verbose, non-blank lines
    data: bytes | bytearray
    starts: np.ndarray
    ends: np.ndarray

    def line_text(self, index: int, limit: int = 300) -> str:
        """The text of line ``index`` (0-based) of this chunk, for error reports."""
        s, e = int(self.starts[index]), int(self.ends[index])
        return self.data[s : min(e, s + limit)].decode("utf-8", errors="replace")


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


def _views(u64: np.ndarray, u32: np.ndarray, data: pa.Buffer, starts: np.ndarray, ends: np.ndarray) -> pa.Array:
    """An Arrow string_view array of ``data[starts[i]:ends[i]]`` without copying the bytes."""
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


def _version_len(w: np.ndarray) -> np.ndarray:
    """Length (3 or 4, 0 if none) of a ``vN,`` / ``vNN,`` field starting each 4-byte word."""
    b0, b1, b2, b3 = (((w >> np.uint32(8 * i)) & np.uint32(0xFF)) for i in range(4))
    is_v = b0 == ord("v")
    digit1 = (b1 >= 48) & (b1 <= 57)
    digit2 = (b2 >= 48) & (b2 <= 57)
    three = is_v & digit1 & (b2 == _COMMA)
    four = is_v & digit1 & digit2 & (b3 == _COMMA)
    return np.where(three, 3, np.where(four, 4, 0))


def scan_chunk(chunk: Chunk) -> ChunkScan:
    """Locate the key, time and timestamp of every verbose line of a chunk."""
    padded = chunk.data
    buf = np.frombuffer(padded, dtype=np.uint8)
    nbytes = chunk.size
    nl = np.flatnonzero(buf[:nbytes] == _NL)
    if nbytes and padded[nbytes - 1] != _NL:
        nl = np.append(nl, nbytes)
    ends = nl.astype(np.int64)
    starts = np.empty_like(ends)
    if len(ends):
        starts[0] = 0
        starts[1:] = ends[:-1] + 1
    nonempty = np.flatnonzero(ends > starts)
    ends[nonempty] -= buf[ends[nonempty] - 1] == _CR
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
    commas = np.flatnonzero(buf[:nbytes] == _COMMA)
    if not len(commas):
        commas = np.array([nbytes], dtype=np.int64)

    # Header: [vN,] [timestamp,] [vN,] -- the rest (component, event, body) is the key.
    ver = _version_len(u32[p])
    ver = np.where(p + ver <= v_end, ver, 0)
    q = p + ver
    first = buf[q]
    is_ts = (q < v_end) & (first >= 48) & (first <= 57)
    next_comma = commas[np.minimum(np.searchsorted(commas, q, side="left"), len(commas) - 1)]
    ts_e = np.minimum(np.where(next_comma >= q, next_comma, v_end), v_end)
    r = np.where(is_ts, np.minimum(ts_e + 1, v_end), q)
    late = _version_len(u32[r]) * ((ver == 0) & is_ts)
    late = np.where(r + late <= v_end, late, 0)
    has_ver = (ver > 0) | (late > 0)
    key_s = r + late

    last = commas[np.maximum(np.searchsorted(commas, v_end, side="left") - 1, 0)]
    has_tail = (last >= key_s) & (last < v_end)
    key_e = np.where(has_tail, last, v_end)
    time_s = np.where(has_tail, last + 1, v_end)

    arrow_data = pa.py_buffer(padded)
    nv = len(vidx)
    prefix = prefix_code(v_marker, has_ver.astype(np.int64))
    key = pl.from_arrow(_views(u64, u32, arrow_data, key_s, key_e))
    time = pl.from_arrow(_views(u64, u32, arrow_data, time_s, v_end)).cast(pl.Float64, strict=False)
    if is_ts.any():
        ts_s = np.where(is_ts, q, 0)
        ts_end = np.where(is_ts, ts_e, 0)
        ts = pl.from_arrow(_views(u64, u32, arrow_data, ts_s, ts_end)).cast(pl.Float64, strict=False)
    else:
        ts = pl.Series(values=np.full(nv, np.nan)).fill_nan(None)
    frame = pl.DataFrame(
        {
            "line": vidx.astype(np.int64),  # 0-based within the chunk; the reader adds the offset
            "prefix": prefix.astype(np.int32),
            "key": key,
            "time": time,
            "ts": ts,
        }
    )
    return ChunkScan(frame, n_lines, n_blank, n_marks, n_foreign, padded, starts, ends)

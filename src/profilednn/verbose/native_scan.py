"""The C first pass (``scan_lines.c``): one sweep over a chunk's bytes per thread.

Built once per machine by :mod:`profilednn.kernels.build` (the system C compiler) and loaded
with ctypes; the call releases the GIL, so chunks scan in parallel. Where no compiler
is available, or ``PROFILEDNN_VERBOSE_NATIVE=0``, :func:`kernel` returns None and the
reader uses the NumPy scan in :mod:`.scan`, which gives the same frame (the tests
compare both on every dialect).
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # NumPy and polars load in the per-line path only: the fused totals need neither
    import numpy as np
    import polars as pl

SOURCE = Path(__file__).with_name("scan_lines.c")
ENV_SWITCH = "PROFILEDNN_VERBOSE_NATIVE"  # "0": always use the NumPy scan
_TIME_SLOW, _TS_SLOW = 1, 2
MIN_VERBOSE_LINE = 13  # len("dnnl_verbose,"): no more verbose lines than size // 13 + 1
TYPICAL_LINE = 64  # room for size // 64 lines first (real lines are longer); all of them on a retry

_lock = threading.Lock()
_loaded: dict[str, object] = {}


def kernel() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    """The compiled ``pdnn_scan_lines`` function, or None (see :func:`unavailable_reason`)."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return None
    with _lock:
        if "fn" not in _loaded:
            _loaded["fn"], _loaded["why"] = _load()
    return _loaded["fn"]  # type: ignore[return-value]


def unavailable_reason() -> str | None:
    """Why the C scan is not used (None when it is)."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return f"{ENV_SWITCH}=0"
    kernel()
    return _loaded.get("why")  # type: ignore[return-value]


def _load() -> tuple[object, str | None]:
    from ..kernels.build import NativeKernelUnavailable, build

    try:
        lib = ctypes.CDLL(str(build(SOURCE)))
    except (NativeKernelUnavailable, OSError) as exc:
        return None, str(exc)
    fn = lib.pdnn_scan_lines
    fn.restype = ctypes.c_int64
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_int64] + [ctypes.c_void_p] * 13
    totals = lib.pdnn_scan_totals
    totals.restype = ctypes.c_int64
    totals.argtypes = ([ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64] + [ctypes.c_void_p] * 10
                       + [ctypes.c_int64] + [ctypes.c_void_p] * 6)
    lib.pdnn_map_file.restype = ctypes.c_void_p
    lib.pdnn_map_file.argtypes = [ctypes.c_int, ctypes.c_int64]
    lib.pdnn_unmap_file.restype = ctypes.c_int
    lib.pdnn_unmap_file.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    _loaded["lib"] = lib
    return fn, None


def totals_library() -> ctypes.CDLL | None:
    """The loaded library (``pdnn_scan_totals``, ``pdnn_map_file`` ...), or None where
    the C scan is unavailable (see :func:`unavailable_reason`)."""
    return _loaded.get("lib") if kernel() is not None else None  # type: ignore[return-value]


def _reparse(data: bytes | bytearray, rows: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> pl.Series:
    """Fields the C code left to polars (signs, ``nan``, odd text): polars' own cast."""
    import polars as pl

    texts = [bytes(data[int(starts[i]) : int(ends[i])]).decode("utf-8", errors="replace") for i in rows]
    return pl.Series(texts, dtype=pl.String).cast(pl.Float64, strict=False)


def native_scan(fn, data: bytes | bytearray, size: int, timestamps: bool) -> tuple[pl.DataFrame, tuple[int, ...]]:
    """Run the C scan over ``data[:size]``: the per-line frame and (lines, blank, marks,
    foreign) counts."""
    done = _run(fn, data, size, timestamps, size // TYPICAL_LINE + 16)
    if done is None:  # many short verbose lines: room for as many as there can be
        done = _run(fn, data, size, timestamps, size // MIN_VERBOSE_LINE + 2)
    if done is None:
        raise RuntimeError("scan_lines.c found more verbose lines than a chunk can hold (a bug)")
    return done


def _run(fn, data: bytes | bytearray, size: int, timestamps: bool, cap: int):
    """One call of the C scan with room for ``cap`` verbose lines; None if that was too few."""
    import numpy as np
    import polars as pl

    line = np.empty(cap, np.int64)
    prefix = np.empty(cap, np.int32)
    shape = np.empty(cap, np.uint64)
    time = np.empty(cap, np.float64)
    ts = np.empty(cap, np.float64)
    flags = np.empty(cap, np.uint8)
    offsets = [np.empty(cap, np.int64) for _ in range(6)]  # key_s, key_e, time_s, end, ts_s, ts_e
    counts = np.zeros(4, np.int64)
    buf = np.frombuffer(data, dtype=np.uint8)
    n = fn(buf.ctypes.data, size, int(timestamps), cap, line.ctypes.data, prefix.ctypes.data,
           shape.ctypes.data, time.ctypes.data, ts.ctypes.data, flags.ctypes.data,
           *(a.ctypes.data for a in offsets), counts.ctypes.data)
    if n < 0:
        return None
    key_s, key_e, time_s, end, ts_s, ts_e = (a[:n] for a in offsets)
    flags = flags[:n]
    time_col = pl.Series("time", time[:n])
    slow = np.flatnonzero(flags & _TIME_SLOW)
    if len(slow):
        time_col = time_col.scatter(slow, _reparse(data, slow, time_s, end))
    ts_col = pl.Series("ts", ts[:n]).fill_nan(None)
    slow = np.flatnonzero(flags & _TS_SLOW)
    if len(slow):
        ts_col = ts_col.scatter(slow, _reparse(data, slow, ts_s, ts_e))
    frame = pl.DataFrame(
        {
            "line": line[:n],
            "prefix": prefix[:n],
            "shape": shape[:n],
            "time": time_col,
            "tlen": np.minimum(end - time_s, 127).astype(np.int8),
            "ts": ts_col,
            "key_s": key_s,
            "key_e": key_e,
        }
    )
    return frame, tuple(int(c) for c in counts)

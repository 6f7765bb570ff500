"""The C first pass (``scan_lines.c``) and the NumPy one must give the same frame.

Shape ids hash differently in each, so the comparison is of everything else: line,
header code, key bounds, time, time length and timestamp -- including which fields are
null -- and the counts of blank, marker and foreign lines.
"""

from __future__ import annotations

import random

import polars as pl
import pytest
from verbose_helpers import FIXTURES

from profilednn.verbose import read_log, scan_log
from profilednn.verbose.native_scan import ENV_SWITCH, kernel, unavailable_reason
from profilednn.verbose.scan import numpy_scan_chunk, scan_chunk
from profilednn.verbose.source import iter_chunks

pytestmark = pytest.mark.skipif(kernel() is None, reason=f"C scan unavailable: {unavailable_reason()}")

_COLUMNS = ["line", "prefix", "key_s", "key_e", "time", "tlen", "ts"]
EXEC = ("onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef,"
        "src:f32::blocked:abcd::f0 dst:f32::blocked:Acdb8a::f0,attr-scratchpad:user,,8x3x3x3,")


def _assert_same_scans(chunks) -> int:
    n = 0
    for chunk in chunks:
        for timestamps in (True, False):
            c_scan = scan_chunk(chunk, timestamps, native=True)
            np_scan = numpy_scan_chunk(chunk, timestamps)
            counts = lambda s: (s.n_lines, s.n_blank, s.n_marks, s.n_foreign)  # noqa: E731
            assert counts(c_scan) == counts(np_scan)
            got, want = c_scan.frame.select(_COLUMNS), np_scan.frame.select(_COLUMNS)
            assert got.equals(want), got.join(want, on="line", suffix="_numpy").filter(
                pl.any_horizontal(pl.col(c).ne_missing(pl.col(f"{c}_numpy")) for c in _COLUMNS[1:])
            )
            # one shape id per distinct (prefix, key) in both scans
            assert c_scan.frame.n_unique(["shape"]) == np_scan.frame.n_unique(["shape"])
            n += got.height
    return n


@pytest.mark.parametrize("log", sorted(FIXTURES.glob("*.log")), ids=lambda p: p.stem)
@pytest.mark.parametrize("chunk_bytes", [1 << 11, 1 << 24])
def test_c_scan_matches_numpy_scan_on_every_fixture(log, chunk_bytes: int):
    assert _assert_same_scans(iter_chunks(log, chunk_bytes)) > 0


def test_c_scan_matches_numpy_scan_on_odd_fields_and_line_ends():
    times = ["0.25", "1", "007", "1e-05", "2.5E+3", "1e5x", "-1", "+1", "nan", "inf", "1.", ".5", " 1", "1 ",
             "0x10", "1" * 15 + ".25", "9" * 30 + "." + "1" * 30, "1" * 80, "", "12,5", "0,0474", "3.4028e38"]
    rng = random.Random(7)
    lines = []
    for i, t in enumerate(times * 3):
        head = rng.choice(["", "[rank1]: ", "glued output", "\r"])
        ts = rng.choice(["", f"{1.7e12 + i:.6f},", "1" * 70 + ",", "17x,"])
        lines.append(f"{head}onednn_verbose,{rng.choice(['', 'v1,'])}{ts}{EXEC[15:]}{t}")
        lines.append(rng.choice(["", "\r", "profilednn_mark,step,1", "dnnl_verbose,", "mkldnn_verbose,exec,",
                                 "onednn_graph_verbose,v1,graph,exec,cpu,x,1.5", "epoch 1 _verbose, x"]))
    text = "\n".join(lines).encode()
    for data in (text, text + b"\n", text + b"\r\n"):
        assert _assert_same_scans(iter_chunks(data, 1 << 10)) >= len(times) * 3


def test_read_log_is_the_same_with_and_without_the_c_scan(monkeypatch):
    logs = sorted(FIXTURES.glob("*.log"))
    with_c = [read_log(p, allow_empty=True) for p in logs]
    report_c = [scan_log(p).report.summary() for p in logs]
    monkeypatch.setenv(ENV_SWITCH, "0")
    assert kernel() is None
    for p, table, summary in zip(logs, with_c, report_c):
        assert table.equals(read_log(p, allow_empty=True)), p.name
        assert scan_log(p).report.summary() == summary, p.name


def test_c_scan_retries_with_room_for_a_chunk_of_short_verbose_lines():
    # ~14 bytes a line: more verbose lines than the first guess (one per 64 bytes) holds
    text = b"dnnl_verbose,\ndnnl_verbose,1\nx\n" * 3000
    assert _assert_same_scans(iter_chunks(text, 1 << 16)) == 2 * 6000  # each scanned with and without timestamps

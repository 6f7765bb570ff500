"""The one-pass totals (``scan_totals``: what ``profilednn breakdown`` runs) must give the
breakdown and report of the per-line reader (``scan_log``) on every log.

Where the C scan is unavailable (no compiler, ``PROFILEDNN_VERBOSE_NATIVE=0``) the
totals come from the per-line reader itself; the comparisons still run, and the tests
that need the fused pass are skipped.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from test_verbose_real_lines import GATED_MLP, GEMM_API_3X, GEMM_API_27, MKLDNN_CONV, MKLDNN_REORDER, SDP
from verbose_helpers import FIXTURES

from profilednn.verbose import breakdown, read_log, scan_log, scan_totals
from profilednn.verbose import totals as totals_mod
from profilednn.verbose.breakdown import _csv_field, breakdown_csv, breakdown_rows
from profilednn.verbose.fields import FLOAT_COLUMNS, INT_COLUMNS, PRIMITIVE_COLUMN_NAMES
from profilednn.verbose.native_scan import ENV_SWITCH, kernel
from profilednn.verbose.schema import PRIMITIVE_SCHEMA

needs_c = pytest.mark.skipif(kernel() is None, reason="the fused pass needs the C scan")
KEY_SETS = [("prim_kind", "prop_kind", "problem"), ("driver", "direction"), ("dialect", "event", "impl"),
            ("flops", "m", "src_tag")]
REPORT_FIELDS = ("lines", "counts", "dialects", "events", "malformed", "notes", "unknown_kinds",
                 "replaced_utf8", "missing_final_newline")
CONV_V36 = ("onednn_verbose,v1,primitive,exec,cpu,convolution,jit:avx2,forward_training,"
            "src:f32::blocked:aBcd8b::f0 wei:f32::blocked:ABcd8b8a::f0 dst:f32::blocked:aBcd8b::f0,,"
            "alg:convolution_direct,mb2_ic8oc8_ih4oh4kh3sh1dh0ph1_iw4ow4kw3sw1dw0pw1,{time}")


def _write(path: Path, lines: list[str], end: str = "\n") -> Path:
    path.write_bytes((end.join(lines) + end).encode())
    return path


def assert_same_csv(ours: str, theirs: str, n_keys: int) -> None:
    """The same CSV, but for the last printed digit of a sum (float additions in another order)."""
    a, b = list(csv.reader(io.StringIO(ours))), list(csv.reader(io.StringIO(theirs)))
    assert len(a) == len(b) and a[0] == b[0]
    for x, y in zip(a[1:], b[1:]):
        assert x[: n_keys + 1] == y[: n_keys + 1]
        floats = zip(x[n_keys + 1:], y[n_keys + 1:])
        assert all(math.isclose(float(u), float(v), rel_tol=1e-9, abs_tol=1.01e-6) for u, v in floats)


def assert_same_as_reader(path: Path, fused: bool | None = None, threads: int = 2) -> None:
    """Totals and the per-line reader agree: groups, calls, times, CSV and report."""
    got = scan_totals(path, threads=threads)
    if fused is not None and kernel() is not None:
        assert got.fused is fused, path
    want = scan_log(path, timestamps=False)
    for keys in KEY_SETS:
        for event in ("exec", "create", "all"):
            a, b = breakdown(got, keys, event), breakdown(want, keys, event)
            assert a.select(*keys, "ncalls").equals(b.select(*keys, "ncalls")), (path.name, keys, event)
            for x, y in zip(a["time_ms"], b["time_ms"]):
                assert math.isclose(x, y, rel_tol=1e-12, abs_tol=1e-12)
            text = breakdown_csv(got, keys, event)
            assert (text is None) == b.is_empty()
            if text is not None:
                assert_same_csv(text, b.write_csv(float_precision=6), len(keys))
    a, b = got.report.to_dict(), want.report.to_dict()
    assert {k: a[k] for k in REPORT_FIELDS} == {k: b[k] for k in REPORT_FIELDS}, path.name
    per_shape, theirs = got.shape_totals(None), want.shape_totals(None)  # the per-shape frames
    assert sorted(per_shape["ncalls"]) == sorted(theirs["ncalls"]) and per_shape.schema == theirs.schema
    assert got.is_empty() == want.events.is_empty()


@pytest.mark.parametrize("log", sorted(FIXTURES.glob("*.log")), ids=lambda p: p.stem)
def test_totals_match_the_per_line_reader_on_every_fixture(log: Path):
    assert_same_as_reader(log, fused=True)


@needs_c
def test_one_pass_totals_match_the_full_table_of_the_numpy_reader(tmp_path: Path, monkeypatch):
    # the fused C pass against the other end: NumPy scan, every line a row of the full table
    logs = [*sorted(FIXTURES.glob("*.log")), _write(tmp_path / "real.log", [GEMM_API_27, SDP, GATED_MLP, GEMM_API_3X])]
    fused = [scan_totals(p) for p in logs]
    assert all(t.fused for t in fused)
    monkeypatch.setenv(ENV_SWITCH, "0")
    for path, totals in zip(logs, fused):
        table = read_log(path, allow_empty=True)
        for keys in KEY_SETS:
            a, b = breakdown(totals, keys, "all"), breakdown(table, keys, "all")
            assert a.select(*keys, "ncalls").equals(b.select(*keys, "ncalls")), (path.name, keys)
            assert all(math.isclose(x, y, rel_tol=1e-12, abs_tol=1e-12) for x, y in zip(a["time_ms"], b["time_ms"]))


def test_real_line_classes_gemm_api_unknown_kinds_and_decimal_commas(tmp_path: Path):
    # gemm_api and unknown kinds are read in the one pass; decimal-comma times need the
    # per-line fix-up, so that log goes through the reader -- with the same result.
    one_pass = _write(tmp_path / "gemm.log", [GEMM_API_27, SDP, GATED_MLP, GEMM_API_3X, SDP, "output"])
    assert_same_as_reader(one_pass, fused=True)
    bd = breakdown(scan_totals(one_pass), ["driver"])
    assert dict(zip(bd["driver"], bd["ncalls"])) == {"matmul": 2, "sdp": 2, "gated_mlp": 1}
    assert math.isclose(bd["time_ms"].sum(), 0.359131 + 1.5 + 2 * 0.874023 + 2.25)
    assert scan_totals(one_pass).report.unknown_kinds == {"sdp": 2, "gated_mlp": 1}
    comma = _write(tmp_path / "comma.log", [MKLDNN_CONV.format(time="9,4747"), MKLDNN_REORDER.format(time="0,0474"),
                                             MKLDNN_REORDER.format(time="0.5,trailing")])
    assert_same_as_reader(comma, fused=False)
    assert breakdown(scan_totals(comma), ["driver"])["time_ms"].to_list() == [9.4747, 0.0474 + 0.5]


def test_odd_time_fields_are_read_by_polars_and_bad_ones_reported_by_line(tmp_path: Path):
    times = ["0.25", "-1", "+2", "1e-3", "nan", "inf", "", "1e5x", "0x10", "9" * 30 + ".5", "3.4028e38", "7"]
    lines = ["glued [rank0]: " + CONV_V36.format(time=t) if i % 3 == 0 else CONV_V36.format(time=t)
             for i, t in enumerate(times)]
    log = _write(tmp_path / "odd.log", lines, end="\r\n")
    assert_same_as_reader(log, fused=True)
    report = scan_totals(log).report
    assert report.counts["malformed"] == 5 and [i.line for i in report.malformed] == [5, 6, 7, 8, 9]  # nan .. 0x10
    stubs = ["dnnl_verbose,", "dnnl_verbose,1", "mkldnn_verbose,exec,", "onednn_graph_verbose,v1,graph,exec,cpu,x,1.5",
             "onednn_verbose,v1,", "onednn_verbose,1700000000.5,", "onednn_verbose,info,oneDNN v3.6"]
    assert_same_as_reader(_write(tmp_path / "stubs.log", [*stubs, *lines]))


@pytest.mark.parametrize("threads", [1, 2, 3, 7])
def test_totals_do_not_depend_on_how_the_file_is_split(tmp_path: Path, threads: int):
    lines = [CONV_V36.format(time=f"{i % 7 + 0.125}") for i in range(300)]
    lines[250] = GATED_MLP  # first seen in the last part: its example keeps its line number
    lines[260] = "profilednn_mark,step,1"
    lines[270] = ""
    log = _write(tmp_path / "split.log", lines)
    assert_same_as_reader(log, fused=True, threads=threads)
    assert scan_totals(log, threads=threads).report.note_examples[0].line == 251


@needs_c
def test_the_reader_runs_where_the_one_pass_cannot(tmp_path: Path, monkeypatch):
    lines = [CONV_V36.format(time="1.5"), MKLDNN_REORDER.format(time="0.5"), "epoch 1 loss 0.25"]
    plain = _write(tmp_path / "plain.log", lines)
    assert_same_as_reader(plain, fused=True)
    gz = tmp_path / "log.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    assert not scan_totals(gz).fused
    assert_same_as_reader(gz)
    bad_utf8 = tmp_path / "bad.log"
    bad_utf8.write_bytes(plain.read_bytes() + b"caf\xe9\n")
    assert_same_as_reader(bad_utf8, fused=False)
    assert scan_totals(bad_utf8).report.replaced_utf8
    good_utf8 = _write(tmp_path / "utf8.log", [*lines, "progress \u2588\u2588 100% \u00b5s"])
    assert_same_as_reader(good_utf8, fused=True)
    malformed = _write(tmp_path / "malformed.log", [*lines, "onednn_verbose,v1,primitive,exec,cpu,reorder,x,0.5"])
    assert_same_as_reader(malformed, fused=False)
    no_newline = tmp_path / "tail.log"
    no_newline.write_bytes(plain.read_bytes().rstrip(b"\n"))
    assert_same_as_reader(no_newline, fused=True)
    assert scan_totals(no_newline).report.missing_final_newline
    monkeypatch.setattr(totals_mod, "SHAPE_SLOTS", 1)  # more shapes than the first table holds: a larger one
    assert_same_as_reader(plain, fused=True)
    monkeypatch.setattr(totals_mod, "SHAPE_SLOTS_MAX", 1)  # ... and than the larger one: the reader
    assert_same_as_reader(plain, fused=False)
    monkeypatch.setattr(totals_mod, "SHAPE_SLOTS", 1 << 10)
    monkeypatch.setattr(totals_mod, "SLOW_CAP", 1)  # more odd time fields than the list holds
    assert_same_as_reader(_write(tmp_path / "slow.log", [CONV_V36.format(time="-1")] * 3), fused=False)
    # ... of lines that are not primitives (their last field is text): those are not needed
    info = [f"onednn_verbose,v1,primitive,create:check,cpu,convolution,unsupported case {i}" for i in range(4)]
    assert_same_as_reader(_write(tmp_path / "checks.log", [*info, *lines]), fused=True)


def test_empty_and_verbose_free_logs_have_no_totals(tmp_path: Path):
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    assert scan_totals(empty).is_empty() and scan_totals(empty).report.lines == 0
    foreign = _write(tmp_path / "foreign.log", ["hello", "onednn_verbose,info,cpu,runtime:OpenMP"])
    totals = scan_totals(foreign)
    assert totals.is_empty() and totals.report.counts["info"] == 1
    assert breakdown_csv(totals, ["driver"]) is None


def test_per_line_columns_cannot_group_totals(tmp_path: Path):
    totals = scan_totals(_write(tmp_path / "a.log", [CONV_V36.format(time="1")]))
    with pytest.raises(ValueError, match="per line"):
        breakdown_rows(totals, ["line"])


def test_csv_fields_are_written_as_polars_writes_them():
    values = {"s": ["x,y", 'q"t', " sp", "a\nb", "", None, "\u00e9", "plain", "a\rb", "#"],
              "f": [1e12, 1.5e-9, -0.0, 123.4567895, float("nan"), float("inf"), None, 2.5e20, 5e-7, 1.5e-6],
              "i": [1, None, -3, 0, 2**40, 7, 8, 9, 10, 11]}
    frame = pl.DataFrame(values, schema={"s": pl.String, "f": pl.Float64, "i": pl.Int64})
    ours = "\n".join(",".join(_csv_field(v) for v in row) for row in zip(*values.values())) + "\n"
    assert "s,f,i\n" + ours == frame.write_csv(float_precision=6)


def test_column_names_without_polars_match_the_schema():
    assert PRIMITIVE_COLUMN_NAMES == tuple(PRIMITIVE_SCHEMA)
    assert FLOAT_COLUMNS == {c for c, t in PRIMITIVE_SCHEMA.items() if t == pl.Float64}
    assert INT_COLUMNS == {c for c, t in PRIMITIVE_SCHEMA.items() if t == pl.Int64}


@needs_c
def test_cli_breakdown_csv_loads_neither_polars_nor_numpy(tmp_path: Path):
    log = _write(tmp_path / "a.log", [CONV_V36.format(time="1.5"), GEMM_API_27])
    code = ("import sys; from profilednn.cli import main; sys.argv = ['profilednn', 'breakdown', sys.argv[1], "
            "'--by', 'prim_kind,prop_kind,problem', '--csv']\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print('loaded:', sorted(m for m in ('polars', 'numpy') if m in sys.modules), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code, str(log)], capture_output=True, text=True, check=True)
    assert "loaded: []" in done.stderr
    want = breakdown(scan_log(log), ["prim_kind", "prop_kind", "problem"]).write_csv(float_precision=6)
    assert done.stdout == want

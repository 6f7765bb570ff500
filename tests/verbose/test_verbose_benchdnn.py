"""benchdnn batch files: written from a parsed log, read back to the same problems."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from profilednn.verbose import batch_lines, decode_problem, format_batch, parse_batch, read_log, scan_log, write_batch
from verbose_helpers import FIXTURES

LOGS = [
    "torch2.14_onednn3.12_small.log", "torch2.14_onednn3.12_mkldnn_ops.log", "torch2.14_onednn3.12_deconv.log",
    "torch2.14_onednn3.12_grouped_dilated.log", "mkldnn_v0.log", "dnnl_v1.log", "onednn_v2.5.log",
    "onednn_v3.2.log", "onednn_v3.3.log", "onednn_v3.6.log",
]


def exec_groups(df: pl.DataFrame) -> dict[tuple, tuple[int, float]]:
    """(driver, direction, problem fields) -> (calls, total ms), straight from the table."""
    out: dict[tuple, list] = {}
    for r in df.filter(pl.col("event") == "exec").iter_rows(named=True):
        try:
            decoded = decode_problem(r["driver"], r["problem"])
            key_fields = (tuple(sorted(decoded.fields.items())), decoded.tensors)
        except ValueError:
            key_fields = (("raw", r["problem"]),)
        key = (r["driver"], r["direction"], r["src_dt"], r["wei_dt"], r["dst_dt"], r["src_tag"], r["wei_tag"],
               r["dst_tag"], r["post_ops"], r["aux"], key_fields)
        slot = out.setdefault(key, [0, 0.0])
        slot[0] += 1
        slot[1] += r["time_ms"]
    return {k: (v[0], v[1]) for k, v in out.items()}


@pytest.mark.parametrize("name", LOGS)
def test_batch_round_trip_gives_the_same_problems_and_counts(name: str):
    df = read_log(FIXTURES / name)
    lines = batch_lines(df)
    back = parse_batch(format_batch(lines))
    assert [b.key() for b in back] == [line.key() for line in lines]
    assert [b.calls for b in back] == [line.calls for line in lines]
    assert sum(b.calls for b in back) == df.filter(pl.col("event") == "exec").height
    assert sum(b.time_ms for b in back) == pytest.approx(df.filter(pl.col("event") == "exec")["time_ms"].sum(), rel=1e-5)
    # every parsed problem decodes to the fields of the rows it came from
    table_problems = {
        (r["driver"], r["direction"]): None for r in df.filter(pl.col("event") == "exec").iter_rows(named=True)
    }
    for b in back:
        direction = b.option("dir") or b.option("prop")
        assert (b.driver, direction) in table_problems
        if b.driver in ("conv", "deconv", "pool", "ip", "matmul"):
            rows = df.filter(
                (pl.col("driver") == b.driver) & (pl.col("event") == "exec")
                & (pl.col("direction").eq_missing(direction))
            )
            decoded = dict(decode_problem(b.driver, b.problem).fields)
            matches = [
                r for r in rows.iter_rows(named=True)
                if all(r[k] == v for k, v in decoded.items() if k in r)
            ]
            assert matches, f"{b.text()} matches no row"


def test_distinct_problem_count_matches_the_table():
    df = read_log(FIXTURES / "torch2.14_onednn3.12_mkldnn_ops.log")
    assert len(batch_lines(df)) == len(exec_groups(df))


def test_conv_line_uses_benchdnn_syntax():
    df = read_log(FIXTURES / "torch2.14_onednn3.12_mkldnn_ops.log")
    conv = [b for b in batch_lines(df) if b.driver == "conv" and b.option("attr-post-ops")][0]
    text = conv.text()
    assert text.startswith("--conv --reset --dir=FWD_B --dt=f32 --stag=abcd --wtag=Acdb8a --dtag=aBcd8b --alg=direct")
    assert "--attr-post-ops=relu" in text
    assert " mb2_ic4oc8_ih8oh8kh3sh1dh0ph1_iw8ow8kw3sw1dw0pw1 # calls=1 " in text
    eltwise = [b for b in batch_lines(df) if b.driver == "eltwise"][0]
    assert eltwise.option("alg") == "relu" and eltwise.option("alpha") == "0" and eltwise.problem == "2x4x8x8"
    pool = {b.option("alg") for b in batch_lines(df) if b.driver == "pool"}
    assert pool == {"max", "avg_p"}


def test_mixed_precision_and_matmul_options():
    df = read_log(FIXTURES / "dnnl_v1.log")
    bf16 = [b for b in batch_lines(df) if b.option("dir") == "BWD_WB"][0]
    assert bf16.option("dt") == "bf16:f32:bf16"
    mm = [b for b in batch_lines(read_log(FIXTURES / "onednn_v3.2.log")) if b.driver == "matmul"]
    assert mm[0].problem == "1x12800x128:1x128x64" and mm[0].option("bia_dt") == "f32"
    gpu = [b for b in batch_lines(read_log(FIXTURES / "onednn_v3.2.log")) if b.option("engine")]
    assert {b.option("engine") for b in gpu} == {"gpu:0"}


def test_lines_are_sorted_by_total_time_and_the_lean_log_agrees():
    log = scan_log(FIXTURES / "torch2.14_onednn3.12_deconv.log")
    lean, full = batch_lines(log), batch_lines(log.table())
    assert [b.key() for b in lean] == [b.key() for b in full]
    times = [b.time_ms for b in lean]
    assert times == sorted(times, reverse=True)


def test_write_batch_is_atomic_and_readable(tmp_path: Path):
    out = write_batch(read_log(FIXTURES / "onednn_v3.3.log"), tmp_path / "sub" / "problems.batch")
    text = out.read_text()
    assert text.startswith("# benchdnn problems")
    assert [p.name for p in out.parent.iterdir()] == ["problems.batch"]  # no temp file left
    assert len(parse_batch(text)) == 7


def test_parse_batch_rejects_lines_it_cannot_read():
    with pytest.raises(ValueError, match="driver switch"):
        parse_batch("mb2ic3oc8ih8kh3\n")
    with pytest.raises(ValueError, match="no problem"):
        parse_batch("--conv --dir=FWD_B\n")
    with pytest.raises(ValueError, match="two problem"):
        parse_batch("--conv 2x3 4x5\n")
    assert parse_batch("# only a comment\n\n") == []

"""Breakdown: calls, time, share and average per group, from the table or the lean log."""

from __future__ import annotations

import polars as pl
import pytest

from profilednn.verbose import breakdown, read_log, scan_log
from verbose_helpers import FIXTURES

DECONV = FIXTURES / "torch2.14_onednn3.12_deconv.log"


def test_default_groups_driver_and_direction_sorted_by_time():
    df = read_log(DECONV)
    bd = breakdown(df)
    assert bd.columns == ["driver", "direction", "ncalls", "time_ms", "percent", "avg_ms"]
    execs = df.filter(pl.col("event") == "exec")
    assert bd["ncalls"].sum() == execs.height
    assert bd["time_ms"].sum() == pytest.approx(execs["time_ms"].sum())
    assert bd["percent"].sum() == pytest.approx(100.0)
    assert bd["time_ms"].to_list() == sorted(bd["time_ms"].to_list(), reverse=True)
    conv_fwd = bd.filter((pl.col("driver") == "deconv") & (pl.col("direction") == "FWD_B")).to_dicts()[0]
    expected = execs.filter((pl.col("driver") == "deconv") & (pl.col("direction") == "FWD_B"))
    assert conv_fwd["ncalls"] == expected.height
    assert conv_fwd["avg_ms"] == pytest.approx(expected["time_ms"].mean())


def test_create_and_all_events():
    df = read_log(DECONV)
    created = breakdown(df, by=["driver"], event="create")
    assert created["ncalls"].sum() == df.filter(pl.col("event").str.starts_with("create")).height
    assert breakdown(df, by=["event"], event="all")["ncalls"].sum() == df.height


def test_lean_log_and_table_give_the_same_breakdown():
    log = scan_log(FIXTURES / "torch2.14_onednn3.12_mkldnn_ops.log")
    for keys in (["driver", "direction"], ["impl"], ["driver", "cfg", "isa"]):
        lean, full = (breakdown(x, keys).sort(keys, nulls_last=True) for x in (log, log.table()))
        assert lean.select(*keys, "ncalls").equals(full.select(*keys, "ncalls")), keys
        for col in ("time_ms", "percent", "avg_ms"):  # summation order differs: compare closely
            assert lean[col].to_list() == pytest.approx(full[col].to_list(), rel=1e-9), (keys, col)


def test_unknown_or_repeated_keys_are_rejected():
    df = read_log(DECONV)
    with pytest.raises(ValueError, match="unknown column"):
        breakdown(df, by=["driver", "nope"])
    with pytest.raises(ValueError, match="repeated"):
        breakdown(df, by=["driver", "driver"])
    with pytest.raises(ValueError, match="event"):
        breakdown(df, event="run")


def test_null_direction_is_its_own_group():
    bd = breakdown(read_log(DECONV))
    reorder = bd.filter(pl.col("driver") == "reorder")
    assert reorder.height == 1 and reorder["direction"].to_list() == [None]

"""Every dialect's lines decode to the right Table-2 fields (hand-made fixtures from the
documented formats, one file per dialect, plus all of them mixed in one log)."""

from __future__ import annotations

import polars as pl
import pytest

from profilednn.verbose import PRIMITIVE_SCHEMA, read_log, read_log_with_report
from verbose_helpers import FIXTURES, row_at


def load(name: str) -> pl.DataFrame:
    return read_log(FIXTURES / f"{name}.log")


def test_every_fixture_has_exactly_the_schema():
    for name in ("mkldnn_v0", "dnnl_v1", "onednn_v2.5", "onednn_v3.2", "onednn_v3.3", "onednn_v3.6"):
        df = load(name)
        assert df.schema == pl.Schema(PRIMITIVE_SCHEMA), name
        assert df.height > 0


def test_mkldnn_v0_conv_reorder_and_lines_without_implementation():
    df = load("mkldnn_v0")
    assert set(df["dialect"]) == {"mkldnn_v0"}
    conv = row_at(df, 6)
    assert conv["event"] == "exec" and conv["engine"] == "cpu" and conv["driver"] == "conv"
    assert conv["impl"] == "jit:avx2" and conv["isa"] == "avx2"
    assert conv["direction"] == "FWD_B"  # fbia:x -> a bias tensor
    assert (conv["mb"], conv["g"], conv["ic"], conv["oc"]) == (2, 1, 16, 16)
    assert (conv["ih"], conv["oh"], conv["kh"], conv["ph"], conv["ph_r"]) == (7, 7, 5, 2, 2)
    assert (conv["src_tag"], conv["wei_tag"], conv["dst_tag"]) == ("nChw8c", "OIhw8i8o", "nChw8c")
    assert conv["cfg"] == "f32"  # MKL-DNN 0.x prints no data type: f32 assumed
    assert conv["time_ms"] == pytest.approx(0.0361328)
    assert row_at(df, 7)["direction"] == "BWD_D"  # fbia:undef
    reorder = row_at(df, 4)
    assert (reorder["driver"], reorder["src_tag"], reorder["dst_tag"], reorder["dims"]) == (
        "reorder", "nchw", "nChw8c", "2x16x7x7")
    assert row_at(df, 3)["event"] == "create"
    old = row_at(df, 13)  # the oldest lines print no implementation field
    assert old["impl"] is None and old["prop_kind"] == "forward_inference" and old["oh"] == 7
    assert row_at(df, 12)["dims"] == "16"
    pool = row_at(df, 9)
    assert (pool["driver"], pool["alg"], pool["oh"], pool["kh"], pool["sh"], pool["ph"]) == (
        "pool", "pooling_max", 4, 3, 2, 1)
    ip = row_at(df, 10)
    assert (ip["m"], ip["n"], ip["k"]) == (1, 4096, 9216)
    assert ip["flops"] == 2 * 1 * 4096 * 9216


def test_dnnl_v1_with_and_without_attributes_and_timestamps():
    df = load("dnnl_v1")
    assert set(df["dialect"]) == {"dnnl_v1"}
    no_attrs = row_at(df, 3)  # DNNL 1.1: no attribute field
    assert (no_attrs["driver"], no_attrs["dims"], no_attrs["attrs"]) == ("reorder", "2x16x7x7", "")
    assert no_attrs["time_ms"] == pytest.approx(0.468994)
    inf = row_at(df, 4)
    assert inf["direction"] == "FWD_I" and inf["isa"] == "avx512_common"
    assert (inf["mb"], inf["ic"], inf["oc"], inf["ih"]) == (32, 32, 32, 256)
    assert row_at(df, 5)["event"] == "create:cache_miss"
    assert row_at(df, 6)["post_ops"] == "relu"  # post_ops:'eltwise_relu;';
    ts = row_at(df, 8)
    assert ts["timestamp_ms"] == pytest.approx(1607393146371.00293)
    assert ts["direction"] == "FWD_B" and ts["time_ms"] == pytest.approx(3.93018)
    mm = row_at(df, 9)
    assert (mm["driver"], mm["m"], mm["n"], mm["k"], mm["batch"]) == ("matmul", 128, 512, 256, 3)
    bf16 = row_at(df, 11)
    assert bf16["direction"] == "BWD_WB"
    assert (bf16["src_dt"], bf16["wei_dt"], bf16["dst_dt"], bf16["cfg"]) == ("bf16", "f32", "bf16", "bf16f32bf16")


def test_onednn_v25_int8_bf16_and_trailing_space_attributes():
    df = load("onednn_v2.5")
    assert set(df["dialect"]) == {"onednn_v2.5"}
    assert row_at(df, 6)["attrs"] == "attr-scratchpad:user"
    bf16 = row_at(df, 7)
    assert bf16["cfg"] == "bf16" and bf16["isa"] == "avx512_core_amx_bf16"
    assert (bf16["oh"], bf16["sh"], bf16["dh"], bf16["ph"]) == (111, 2, 1, 1)
    int8 = row_at(df, 9)
    assert int8["cfg"] == "u8s8u8" and int8["post_ops"] == "relu"
    assert row_at(df, 10)["direction"] == "FWD_I"
    elt = row_at(df, 11)
    assert elt["timestamp_ms"] == pytest.approx(1678896420912.5) and elt["alg"] == "eltwise_relu"


def test_onednn_v32_dispatch_lines_are_not_rows_and_gpu_engines_are():
    df, report = read_log_with_report(FIXTURES / "onednn_v3.2.log")
    assert set(df["dialect"]) == {"onednn_v3.2"}
    assert report.counts["dispatch"] == 2  # create:check and create:dispatch
    assert sorted(df["line"].to_list()) == [8, 9, 10, 11, 12]
    mm = row_at(df, 9)
    assert (mm["m"], mm["n"], mm["k"], mm["batch"]) == (12800, 64, 128, 1)
    gpu = row_at(df, 11)
    assert gpu["engine"] == "gpu:0" and gpu["cfg"] == "f16" and gpu["isa"] == "gpu"
    gmm = row_at(df, 12)  # src:wei:dst matmul descriptor
    assert (gmm["m"], gmm["n"], gmm["k"]) == (3000, 3000, 3000)


def test_onednn_v33_component_field_graph_and_error_lines():
    df, report = read_log_with_report(FIXTURES / "onednn_v3.3.log")
    assert set(df["dialect"]) == {"onednn_v3.3"}
    assert report.counts["graph"] == 2 and report.counts["error"] == 2
    conv = row_at(df, 9)
    assert conv["post_ops"] == "sum:1+relu" and conv["timestamp_ms"] == pytest.approx(1703000000001.5)
    assert (conv["kh"], conv["oc"]) == (1, 256)
    assert row_at(df, 10)["driver"] == "lnorm" and row_at(df, 10)["dims"] == "32x128x768"
    sm = row_at(df, 11)
    assert sm["driver"] == "softmax" and sm["alg"] == "softmax_accurate" and "axis:3" in sm["aux"]
    assert row_at(df, 12)["driver"] == "binary"
    assert row_at(df, 13)["driver"] == "concat"
    pool = row_at(df, 17)
    assert pool["direction"] == "BWD_D" and (pool["ih"], pool["oh"], pool["ph_r"]) == (112, 56, 0)
    rnn = row_at(df, 18)
    assert rnn["driver"] == "rnn" and rnn["dims"] == "10x32x128" and rnn["alg"] == "vanilla_lstm"


def test_onednn_v36_versioned_header_both_timestamp_positions_and_post_ops():
    df = load("onednn_v3.6")
    assert set(df["dialect"]) == {"onednn_v3.6"}
    bmm = row_at(df, 6)
    assert (bmm["m"], bmm["n"], bmm["k"], bmm["batch"]) == (128, 128, 64, 12)
    assert bmm["cfg"] == "bf16bf16f32"
    runtime = row_at(df, 7)  # a runtime M
    assert runtime["m"] is None and runtime["n"] == 4096 and runtime["flops"] is None
    deconv = row_at(df, 8)
    assert deconv["driver"] == "deconv" and deconv["direction"] == "BWD_WB"
    assert (deconv["ih"], deconv["oh"], deconv["ph"], deconv["ph_r"]) == (5, 10, 1, 0)
    assert row_at(df, 9)["post_ops"] == "relu+sum:1:0:f32+add:f32:2"
    assert row_at(df, 12)["engine"] == "gpu:1"
    before = row_at(df, 13)  # timestamp before the version field
    assert before["timestamp_ms"] == pytest.approx(1735000000003.5) and before["direction"] == "BWD_D"
    v0 = row_at(df, 14)  # ``v0`` header with oneDNN 3.x memory descriptors
    assert v0["event"] == "create:cache_miss" and v0["src_tag"] == "aBcd16b"
    no_ts = row_at(df, 15)
    assert no_ts["timestamp_ms"] is None and no_ts["direction"] == "BWD_WB" and no_ts["k"] == 2048


def test_mixed_dialects_in_one_log_keep_physical_line_numbers():
    names = ("mkldnn_v0", "dnnl_v1", "onednn_v2.5", "onednn_v3.2", "onednn_v3.3", "onednn_v3.6")
    texts = [(FIXTURES / f"{n}.log").read_text().splitlines() for n in names]
    mixed = [line for pair in zip(*[t[:11] for t in texts]) for line in pair]
    df = read_log(mixed)
    assert set(df["dialect"]) == set(names)
    markers = {"mkldnn_v0": "mkldnn_verbose,", "dnnl_v1": "dnnl_verbose,"}
    for row in df.iter_rows(named=True):
        source = mixed[row["line"] - 1]
        assert f",{row['problem']}," in source
        assert source.startswith(markers.get(row["dialect"], "onednn_verbose,"))
        assert float(source.rsplit(",", 1)[1]) == row["time_ms"]

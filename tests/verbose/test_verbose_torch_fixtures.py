"""Real logs captured from this machine's PyTorch 2.14 / oneDNN 3.12 with
``ONEDNN_VERBOSE=all ONEDNN_VERBOSE_TIMESTAMP=1`` (see fixtures/verbose/make_torch_fixtures.py)."""

from __future__ import annotations

import polars as pl
import pytest

from profilednn.verbose import read_log, read_log_with_report
from verbose_helpers import FIXTURES


def execs(name: str, driver: str | None = None) -> pl.DataFrame:
    df = read_log(FIXTURES / f"torch2.14_onednn3.12_{name}.log")
    df = df.filter(pl.col("event") == "exec")
    return df.filter(pl.col("driver") == driver) if driver else df


def by_direction(df: pl.DataFrame) -> dict[str, dict]:
    return {r["direction"]: r for r in df.iter_rows(named=True)}


def test_conv_forward_and_backward_from_the_small_log():
    df, report = read_log_with_report(FIXTURES / "torch2.14_onednn3.12_small.log")
    assert report.counts["dispatch"] == 24 and report.counts["info"] == 5 and report.counts["template"] == 1
    assert report.counts["foreign"] == 13  # T0/T1 markers and PyTorch's build summary
    conv = by_direction(df.filter((pl.col("driver") == "conv") & (pl.col("event") == "exec")))
    assert set(conv) == {"FWD_B", "BWD_WB"}
    fwd = conv["FWD_B"]
    assert fwd["line"] == 21 and fwd["dialect"] == "onednn_v3.6"
    assert fwd["timestamp_ms"] == pytest.approx(1795317249462.326904)
    assert (fwd["mb"], fwd["ic"], fwd["oc"], fwd["ih"], fwd["iw"], fwd["kh"], fwd["ph"], fwd["pw_r"]) == (
        2, 3, 8, 16, 16, 3, 1, 1)
    assert (fwd["src_tag"], fwd["wei_tag"], fwd["dst_tag"]) == ("abcd", "Acdb8a", "aBcd8b")
    # 2 * mb * oc * ic * taps-inside: 16*3 - 2 taps per row/column fall into padding
    assert fwd["flops"] == 2 * 2 * 8 * 3 * 46 * 46
    assert fwd["flops_dense"] == 2 * 2 * 8 * 3 * 16 * 16 * 9
    assert fwd["bytes"] == 4 * (2 * 3 * 16 * 16 + 8 * 3 * 3 * 3 + 8 + 2 * 8 * 16 * 16)


def test_channels_last_convolution_uses_acdb_and_brgemm():
    conv = by_direction(execs("conv_channels_last", "conv"))
    assert conv["FWD_B"]["src_tag"] == "acdb" and conv["FWD_B"]["impl"] == "brg_conv_fwd:avx2"
    bwd_d = conv["BWD_D"]
    assert bwd_d["impl"] == "brg_conv_bwd:avx2+brg_conv_fwd:avx2" and bwd_d["isa"] == "avx2"
    # backward by data reads diff_dst and weights and writes diff_src
    assert bwd_d["bytes"] == 4 * (2 * 8 * 8 * 8 + 8 * 4 * 3 * 3 + 2 * 4 * 8 * 8)
    assert {r["direction"] for r in conv.values()} == {"FWD_B", "BWD_D", "BWD_WB"}


def test_conv_transpose_decodes_as_deconv_with_right_padding():
    rows = by_direction(execs("deconv", "deconv"))
    assert set(rows) == {"FWD_B", "BWD_D", "BWD_WB"}
    f = rows["FWD_B"]
    assert (f["ic"], f["oc"], f["ih"], f["oh"], f["kh"], f["sh"], f["ph"], f["ph_r"]) == (4, 6, 5, 10, 3, 2, 1, 0)
    assert f["flops_dense"] == 2 * 2 * 6 * 4 * 5 * 5 * 9


def test_grouped_dilated_convolution():
    rows = by_direction(execs("grouped_dilated", "conv"))
    f = rows["FWD_D"]  # bias=False
    assert (f["g"], f["ic"], f["oc"], f["dh"], f["dw"], f["ph"], f["oh"]) == (4, 8, 8, 1, 1, 2, 9)
    assert f["wei_tag"] == "abcde" and f["isa"] == "uni"  # x64:gemm:jit
    assert set(rows) == {"FWD_D", "BWD_D", "BWD_W"}


def test_depthwise_strided_convolution():
    f = by_direction(execs("depthwise_strided", "conv"))["FWD_B"]
    assert (f["g"], f["ic"], f["oc"], f["sh"], f["ih"], f["oh"]) == (8, 8, 8, 2, 9, 5)
    assert f["impl"] == "jit_dw:avx2"


def test_conv1d_runs_as_2d_with_unit_height():
    f = by_direction(execs("conv1d", "conv"))["FWD_B"]
    assert (f["ih"], f["kh"], f["iw"], f["ow"], f["kw"], f["sw"], f["pw"], f["pw_r"]) == (1, 1, 20, 10, 5, 2, 2, 1)
    assert f["dims"] == "2x4x1x20"


def test_mkldnn_tensor_ops_post_ops_and_3d_conv():
    df = execs("mkldnn_ops")
    drivers = set(df["driver"])
    assert {"pool", "eltwise", "sum", "binary", "softmax", "bnorm", "ip", "conv", "reorder"} <= drivers
    fused = df.filter(pl.col("post_ops").is_not_null()).select("driver", "post_ops").rows()
    assert ("conv", "relu") in fused and ("ip", "gelu_erf") in fused
    conv3d = df.filter((pl.col("driver") == "conv") & (pl.col("kd") == 3)).to_dicts()
    assert len(conv3d) == 1
    c = conv3d[0]
    assert (c["id"], c["od"], c["pd"], c["pd_r"], c["dims"]) == (6, 6, 1, 1, "1x2x6x6x6")
    bnorm = df.filter(pl.col("driver") == "bnorm").to_dicts()[0]
    assert (bnorm["mb"], bnorm["ic"], bnorm["ih"], bnorm["direction"]) == (2, 4, 8, "FWD_I")
    pool_algs = set(df.filter(pl.col("driver") == "pool")["alg"])
    assert pool_algs == {"pooling_max", "pooling_avg_include_padding"}


def test_nested_matmul_creation_is_a_create_event():
    df = read_log(FIXTURES / "torch2.14_onednn3.12_mkldnn_ops.log")
    nested = df.filter(pl.col("event") == "create_nested:cache_miss").to_dicts()
    assert nested and all(r["driver"] == "matmul" for r in nested)
    assert {(r["m"], r["k"], r["n"]) for r in nested} == {(2, 16, 10), (4, 16, 10)}


def test_profile_exec_log_without_timestamps():
    df = read_log(FIXTURES / "torch2.14_onednn3.12_profile_exec.log")
    assert df["timestamp_ms"].null_count() == df.height
    assert set(df["event"]) == {"exec"} and df.height == 6

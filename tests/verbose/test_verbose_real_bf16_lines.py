"""BF16 lines printed by oneDNN on CPUs with native BF16 (AMX), read end to end.

The lines are copied from logs users posted publicly, not written by hand:

* an AMX BF16 convolution with a fused ReLU (benchdnn, oneDNN rls-v3.6, Xeon with
  ``avx10_1_512_amx``; uxlfoundation/oneDNN issue #2088);
* the f32 -> bf16 weight reorders a BF16 model's first step runs (Emerald Rapids;
  openvinotoolkit/oneDNN issue #317).

They fix what a BF16 Run depends on: the dtype, implementation and ISA are decoded, the
convolution's FLOPs count as bf16 model FLOPs (MFU holds them against the bf16 peak), the
reorders' time is kept, and the convolution becomes a bf16 replay case.
"""

from __future__ import annotations

import polars as pl

from profilednn.projection.cases import primitive_case
from profilednn.hardware.dtypes import flops_by_dtype
from profilednn.vocabulary import cfg_dtype
from profilednn.verbose import read_log

AMX_CONV = (
    "onednn_verbose,v1,primitive,exec,cpu,convolution,brg_conv_fwd:avx10_1_512_amx,forward_training,"
    "src:bf16:a:blocked:acdb::f0 wei:bf16:a:blocked:AcdB16a2b::f0 bia:bf16:a:blocked:a::f0 "
    "dst:bf16:a:blocked:acdb::f0,attr-post-ops:eltwise_relu:0:1,alg:convolution_direct,"
    "mb1_ic16oc16_ih208oh208kh3sh1dh0ph1_iw32ow32kw3sw1dw0pw1,0.0310059"
)
BF16_REORDERS = [
    "onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef,src:f32::blocked:abcde::f0 "
    "dst:bf16::blocked:debcA16a::f0,,,96x1x1x3x3,0.0018",
    "onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef,src:f32::blocked:abcd::f0 "
    "dst:bf16:p:blocked:ABcd16b16a2b::f0,,,24x96x1x1,0.0164",
    "onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef,src:f32::blocked:a::f0 "
    "dst:bf16::blocked:a::f0,,,144,0.001",
]


def _read(tmp_path, lines: list[str]) -> pl.DataFrame:
    log = tmp_path / "bf16.log"
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return read_log(log)


def test_amx_bf16_convolution_is_decoded_as_bf16(tmp_path):
    row = _read(tmp_path, [AMX_CONV]).row(0, named=True)
    assert (row["driver"], row["isa"], row["prop_kind"]) == ("conv", "avx10_1_512_amx", "forward_training")
    assert (row["src_dt"], row["wei_dt"], row["dst_dt"]) == ("bf16", "bf16", "bf16")
    assert (row["mb"], row["ic"], row["oc"], row["ih"], row["iw"], row["kh"], row["kw"]) == (1, 16, 16, 208, 32, 3, 3)
    assert row["flops_dense"] == 2 * 1 * 16 * 208 * 32 * 16 * 3 * 3
    assert row["time_ms"] == 0.0310059
    assert cfg_dtype(row["src_dt"]) == "bf16"


def test_bf16_conv_flops_count_as_bf16_model_flops(tmp_path):
    df = _read(tmp_path, [AMX_CONV, *BF16_REORDERS])
    prims = (df.with_columns(pl.lit(2.0).alias("calls_per_step"),
                           pl.col("src_dt").map_elements(cfg_dtype, return_dtype=pl.Utf8).alias("dtype")))
    assert flops_by_dtype(prims, pl.DataFrame()) == {"bf16": 2.0 * 2 * 16 * 208 * 32 * 16 * 9}


def test_bf16_reorders_keep_their_time(tmp_path):
    df = _read(tmp_path, BF16_REORDERS)
    assert df["driver"].to_list() == ["reorder"] * 3
    assert df["dst_dt"].to_list() == ["bf16"] * 3
    assert abs(df["time_ms"].sum() - (0.0018 + 0.0164 + 0.001)) < 1e-12


def test_amx_bf16_convolution_becomes_a_bf16_replay_case(tmp_path):
    row = _read(tmp_path, [AMX_CONV]).row(0, named=True)
    case, why = primitive_case(row)
    assert case is not None, why
    assert case["kind"] == "conv"
    assert case.get("dtype") == "bf16"

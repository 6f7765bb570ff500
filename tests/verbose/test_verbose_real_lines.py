"""Line formats seen in real logs that a naive field split gets wrong.

Each fixture follows a line printed by a real oneDNN / MKL-DNN build:

* MKL-DNN 0.18 on a decimal-comma locale (Windows) prints 9.4747 ms as ``,9,4747``;
* ``gemm_api`` lines come from oneDNN's sgemm API (``dnnl_sgemm``); 2.7 printed no
  auxiliary field (the first line is from oneDNN issue #1442), 3.x prints one;
* a fused SDPA partition (``gpu,100002,sdp,...``, oneDNN's graph-verbose RFC) and a
  kind this parser does not know (``gated_mlp``) stay rows and are reported as unknown.

Every exec line's time is also summed independently of the parser: nothing may be lost.
"""

from __future__ import annotations

import math

import polars as pl

from profilednn.verbose import breakdown, read_log_with_report, scan_log

MKLDNN_CONV = (
    "mkldnn_verbose,exec,convolution,jit:avx2,forward_inference,fsrc:nChw8c fwei:OIhw8i8o fbia:x "
    "fdst:nChw8c,alg:convolution_direct,mb1_ic64oc64_ih56oh56kh3sh1dh0ph1_iw56ow56kw3sw1dw0pw1,{time}"
)
MKLDNN_REORDER = "mkldnn_verbose,exec,reorder,jit:uni,undef,in:f32_nchw out:f32_nChw8c,num:1,1x64x56x56,{time}"
GEMM_API_27 = (
    "onednn_verbose,exec,cpu,gemm_api,,undef,src_f32::blocked:ab:f0 wei_f32::blocked:ab:f0 "
    "dst_f32::blocked:ab:f0,,1x512:512x512,0.359131"
)
GEMM_API_3X = (
    "onednn_verbose,v1,primitive,exec,cpu,gemm_api,,undef,src:f32::blocked:ba::f0 wei:f32::blocked:ab::f0 "
    "dst:f32::blocked:ab::f0,lda:1024 attr-post-ops:sum:1,,64x1024:1024x256,1.5"
)
SDP = (
    "onednn_verbose,v1,primitive,exec,gpu,100002,sdp,matmul_qk;scale_div;mask_add;softmax;matmul_v,,"
    "in0_f16:1:strided:undef:1x16x384x64:393216s24576s64s1 in1_f16:2:strided:undef:1x16x384x64:393216s24576s64s1 "
    "out0_f16:6:strided:undef:1x16x384x64:393216s24576s64s1,fpm:strict,sdp_primitive_v1_kernel_t,dnnl_backend,0.874023"
)
GATED_MLP = (
    "onednn_verbose,v1,primitive,exec,cpu,gated_mlp,ref:any,undef,src:f32::blocked:ab::f0 "
    "wei:f32::blocked:ab::f0 dst:f32::blocked:ab::f0,,,32x4096:4096x11008,2.25"
)


def _independent_total(lines: list[str], decimal_comma: bool = False) -> float:
    """Sum of the exec times, read with nothing but a split (the check the issue ran)."""
    total = 0.0
    for line in lines:
        fields = line.split(",")
        if decimal_comma and fields[-2].isdigit() and fields[-1].isdigit():
            total += float(f"{fields[-2]}.{fields[-1]}")
        else:
            total += float(fields[-1])
    return total


def test_decimal_comma_times_keep_their_fraction():
    times = ["9,4747", "0,0474", "12,5", "0,000977"]
    lines = [MKLDNN_CONV.format(time=t) for t in times] + [MKLDNN_REORDER.format(time="1,25")]
    df, r = read_log_with_report(lines)
    assert df["time_ms"].to_list() == [9.4747, 0.0474, 12.5, 0.000977, 1.25]
    assert math.isclose(df["time_ms"].sum(), _independent_total(lines, decimal_comma=True))
    assert r.counts["malformed"] == 0 and "extra_fields" not in r.notes
    assert df["driver"].to_list() == ["conv"] * 4 + ["reorder"]
    assert df["problem"][0] == "mb1_ic64oc64_ih56oh56kh3sh1dh0ph1_iw56ow56kw3sw1dw0pw1"


def test_a_digit_field_is_a_decimal_comma_only_where_the_field_count_says_so():
    # Both last fields are digits, but without the extra field the layout is complete:
    # "...,1x64x56x56,3" is problem then time 3, not 56.3.
    plain = MKLDNN_REORDER.format(time="3")
    # An extra non-digit field after a full layout keeps the time at its position.
    extra = MKLDNN_REORDER.format(time="0.5,trailing")
    # Digit integer part but a fraction that is not all digits: not a decimal comma.
    odd = MKLDNN_REORDER.format(time="2,0.5")
    df, r = read_log_with_report([plain, extra, odd])
    assert df["time_ms"].to_list() == [3.0, 0.5, 2.0]
    assert r.counts["malformed"] == 0 and r.notes.get("extra_fields") == 1


def test_gemm_api_lines_are_matmul_rows_with_m_n_k_and_flops():
    df, r = read_log_with_report([GEMM_API_27, GEMM_API_3X])
    assert r.counts["malformed"] == 0 and r.unknown_kinds == {}
    assert df["driver"].to_list() == ["matmul", "matmul"]
    assert df["prim_kind"].to_list() == ["gemm_api", "gemm_api"]
    assert df.select("m", "n", "k").rows() == [(1, 512, 512), (64, 256, 1024)]
    assert df["flops"].to_list() == [2.0 * 1 * 512 * 512, 2.0 * 64 * 256 * 1024]
    assert df["time_ms"].to_list() == [0.359131, 1.5]
    assert df["attrs"][1] == "lda:1024 attr-post-ops:sum:1"
    by_driver = breakdown(df, ["driver"])
    assert by_driver.rows()[0][:3] == ("matmul", 2, 0.359131 + 1.5)


def test_unknown_kinds_stay_rows_and_are_reported():
    conv = MKLDNN_CONV.format(time="1.0")
    lines = [SDP, GATED_MLP, conv, SDP]
    df, r = read_log_with_report(lines)
    assert df["line"].to_list() == [1, 2, 3, 4]
    assert df["prim_kind"].to_list() == ["sdp", "gated_mlp", "convolution", "sdp"]
    assert df["engine"].to_list() == ["gpu", "cpu", "cpu", "gpu"]
    assert math.isclose(df["time_ms"].sum(), _independent_total(lines))
    assert r.counts["malformed"] == 0
    assert r.unknown_kinds == {"sdp": 2, "gated_mlp": 1} and r.notes["unknown_kind"] == 3
    assert "unknown primitive kind: gated_mlp (1), sdp (2)" in r.summary()
    assert r.to_dict()["unknown_kinds"] == {"sdp": 2, "gated_mlp": 1}
    # The lean path (what `profilednn breakdown` runs) counts them too.
    bd = breakdown(scan_log(lines), ["prim_kind"])
    assert dict(zip(bd["prim_kind"], bd["ncalls"])) == {"sdp": 2, "gated_mlp": 1, "convolution": 1}


def test_broken_lines_of_known_kinds_are_still_malformed_not_unknown():
    truncated = "onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef,0.5"
    no_engine = "onednn_verbose,v1,primitive,exec,weird engine,100002,sdp,x,0.5"
    df, r = read_log_with_report([truncated, no_engine, GATED_MLP])
    assert df["line"].to_list() == [3]
    assert r.counts["malformed"] == 2 and r.unknown_kinds == {"gated_mlp": 1}


def test_every_exec_time_of_a_mixed_log_is_counted():
    lines = [
        MKLDNN_CONV.format(time="9,4747"), GEMM_API_27, SDP, GATED_MLP, GEMM_API_3X,
        MKLDNN_REORDER.format(time="0,5"), "program output, 12,5",
    ]
    df, r = read_log_with_report(lines)
    expected = 9.4747 + 0.359131 + 0.874023 + 2.25 + 1.5 + 0.5
    assert math.isclose(df["time_ms"].sum(), expected)
    lean = scan_log(lines)
    assert math.isclose(breakdown(lean, ["driver"])["time_ms"].sum(), expected)
    assert r.counts["foreign"] == 1 and df.height == 6
    assert df.filter(pl.col("driver") == "matmul").height == 2


def test_batch_files_leave_out_kinds_benchdnn_has_no_driver_for():
    from profilednn.verbose import batch_lines

    drivers = [b.driver for b in batch_lines(scan_log([SDP, GATED_MLP, GEMM_API_27]))]
    assert drivers == ["matmul"]

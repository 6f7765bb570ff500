"""Step model realism: cold replays, the in-situ/replay calibration, conv geometry from oneDNN."""

from __future__ import annotations

import polars as pl
import pytest

from profilednn.projection import worker
from profilednn.projection.step_model import (
    calibrate_ops, conv_calls, native_calibration, step_parts,
)

F = "['float', 'float', '', 'ScalarList', 'ScalarList', 'ScalarList', 'Scalar', 'ScalarList', 'Scalar']"
OPS_SCHEMA = {"op": pl.Utf8, "module": pl.Utf8, "phase": pl.Utf8, "input_shapes": pl.Utf8,
              "dtypes": pl.Utf8, "step": pl.Int64, "calls": pl.Int64, "self_time_ms": pl.Float64,
              "total_time_ms": pl.Float64, "onednn_ms": pl.Float64}


def _otab() -> pl.DataFrame:
    return pl.DataFrame({
        "case_id": ["o0", "o1", "o2", "o3"],
        "op": ["aten::native_batch_norm", "aten::add_", "aten::relu_", "aten::mm"],
        "input_shapes": ["[[2, 4, 8, 8]]", "[[2, 4, 8, 8], [2, 4, 8, 8], []]", "[[2, 4, 8, 8]]",
                         "[[2, 4], [4, 4]]"],
        "dtypes": ["['float']", "['float', 'float', 'Scalar']", "['float']", "['float', 'float']"],
        "family": ["norm", "elementwise", "elementwise", "gemm"],
        "calls_per_step": [2.0, 1.0, 4.0, 1.0],
        "in_situ_total_ms": [6.0, 3.0, 2.0, 1.0],   # per step
        "replay_ms": [0.5, 0.5, 0.1, 0.2],           # at the target
    })


def test_native_calibration_is_in_situ_over_replay_per_family():
    at_a = {"o0": 1.5, "o1": 1.0, "o2": 0.25, "o3": None}  # the GEMM was not replayed at A
    cal = native_calibration(_otab(), at_a)
    factor = dict(cal.select("family", "factor").iter_rows())
    assert factor["norm"] == pytest.approx(6.0 / (2 * 1.5))
    assert factor["elementwise"] == pytest.approx((3.0 + 2.0) / (1.0 + 4 * 0.25))
    assert "gemm" not in factor
    out = calibrate_ops(_otab(), cal)
    got = dict(out.select("case_id", "calibrated_ms").iter_rows())
    assert got["o0"] == pytest.approx(0.5 * 2.0)
    assert got["o2"] == pytest.approx(0.1 * 2.5)
    assert got["o3"] is None  # no factor: the step model falls back to replay_ms


def test_a_calibration_factor_from_a_disturbed_replay_is_not_applied():
    at_a = {"o0": 150.0, "o1": 1.0, "o2": 0.25}  # the norm replay at A took 50x its in-situ time
    cal = native_calibration(_otab(), at_a)
    rows = {f: (x, used) for f, x, used in cal.select("family", "factor", "used").iter_rows()}
    assert rows["norm"] == (pytest.approx(6.0 / 300.0), False) and rows["elementwise"][1] is True
    got = dict(calibrate_ops(_otab(), cal).select("case_id", "calibrated_ms").iter_rows())
    assert got["o0"] is None and got["o2"] == pytest.approx(0.1 * 2.5)  # norm: its plain replay


def test_native_calibration_is_empty_without_a_replay_at_a():
    assert native_calibration(_otab(), {}).is_empty()
    assert native_calibration(pl.DataFrame(), {"o0": 1.0}).is_empty()
    assert calibrate_ops(_otab(), native_calibration(_otab(), {})).columns == _otab().columns


def test_step_parts_use_the_calibrated_time_of_native_kernels():
    ops = pl.DataFrame([{"op": "aten::native_batch_norm", "module": "bn", "phase": "forward",
                         "input_shapes": "[[2, 4, 8, 8]]", "dtypes": "['float']", "step": 0,
                         "calls": 2, "self_time_ms": 6.0, "total_time_ms": 6.0, "onednn_ms": 0.0}],
                       schema=OPS_SCHEMA)
    steps = pl.DataFrame({"step": [0], "time_ms": [10.0], "forward_ms": [8.0]})
    otab = _otab()
    plain = step_parts(steps, ops, pl.DataFrame(), pl.DataFrame(), otab, pl.DataFrame())
    calibrated = step_parts(steps, ops, pl.DataFrame(), pl.DataFrame(),
                            calibrate_ops(otab, native_calibration(otab, {"o0": 1.5})), pl.DataFrame())

    def native(parts: pl.DataFrame) -> float:
        return float(parts.filter(pl.col("part") == "native kernels")["projected_ms"].sum())

    assert native(plain) == pytest.approx(2 * 0.5)
    assert native(calibrated) == pytest.approx(2 * 0.5 * 2.0)
    assert calibrated["in_situ_ms"].sum() == pytest.approx(10.0)


@pytest.mark.cpu_facing
def test_llc_bytes_reads_the_largest_cache():
    assert worker.llc_bytes() >= 1 << 16


def test_evicted_cases_run_the_evictor_before_each_timed_call():
    counted: list[int] = []
    case = {"id": "m", "kind": "matmul", "a": [4, 4], "b": [4, 4], "dtype": "f32"}
    warm = worker._time_case(dict(case), 0.001, 3, 3, evictor=lambda: counted.append(1))
    assert not counted and warm["evicted"] is False
    cold = worker._time_case({**case, "evict": True}, 0.001, 3, 3, evictor=lambda: counted.append(1))
    assert cold["evicted"] is True
    assert len(counted) >= 3 + len(cold["wall_ms"])  # warm-up calls and every timed call


@pytest.mark.cpu_facing
def test_cache_evictor_writes_the_bytes_it_is_given():
    ev = worker.CacheEvictor(1 << 16)
    before = float(ev.buffer[0])
    ev()
    assert float(ev.buffer[0]) == before + 1.0
    assert ev.buffer.numel() * 4 == ev.nbytes == 1 << 16


def _conv_prim(module: str, d: int) -> dict:
    """A oneDNN forward conv primitive as the reader decodes it (3x3, stride 1, dilation d)."""
    return {"driver": "conv", "module": module, "direction": "FWD_D", "src_tag": "abcd",
            "dst_tag": "abcd", "mb": 2, "g": 1, "ic": 8, "oc": 8, "ih": 16, "iw": 16, "oh": 16,
            "ow": 16, "kh": 3, "kw": 3, "sh": 1, "sw": 1, "dh": d - 1, "dw": d - 1, "ph": d,
            "pw": d, "src_dt": "f32"}


def test_conv_calls_take_dilation_and_padding_from_the_modules_primitive():
    x, w = "[2, 8, 16, 16]", "[8, 8, 3, 3]"
    row = {"op": "aten::convolution", "module": "head", "phase": "forward",
           "input_shapes": f"[{x}, {w}, [], [], [], [], [], [], []]", "dtypes": F, "step": 0,
           "calls": 1, "self_time_ms": 1.0, "total_time_ms": 1.0, "onednn_ms": 1.0}
    bwd = {**row, "op": "aten::convolution_backward",
           "input_shapes": f"[{x}, {x}, {w}, [], [], [], [], [], [], [], []]"}
    ops = pl.DataFrame([row, bwd], schema=OPS_SCHEMA)
    cases, calls = conv_calls(ops, pl.DataFrame([_conv_prim("head", 2)]))
    assert {tuple(c["d"]) for c in cases} == {(2, 2)}
    assert {tuple(c["p"]) for c in cases} == {(2, 2)}
    assert calls["note"].null_count() == calls.height  # nothing assumed
    # without the primitive: dilation 1 is assumed, and said
    cases, calls = conv_calls(ops, pl.DataFrame())
    assert {tuple(c["d"]) for c in cases} == {(1, 1)}
    assert all("dilation 1" in n for n in calls["note"].to_list())


def test_native_conv_advice_points_at_the_recipe_that_ab_tests_it():
    from profilednn.analysis.conv_rules import CAUSE_ACTION
    from profilednn.optimization.recipes import load_recipes

    threads = load_recipes()["threads"]
    assert "native_conv_fallback" in threads.advice_rules
    assert "`threads` recipe of `profilednn optimize`" in CAUSE_ACTION["threads"]

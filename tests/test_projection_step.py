"""The step model (projected_step_ms), conv calls replayed whole, the native-conv advice."""

from __future__ import annotations

import polars as pl
import pytest

from profilednn.analysis import Analysis, advise
from profilednn.analysis.conv_rules import fallback_cause
from profilednn.projection.replay import ReplayResult, run_worker
from profilednn.projection.step_model import (
    attach_conv_replay, by_part, by_phase, conv_calls, conv_geometry, step_parts,
    step_summary, target_path, whatif_step,
)
from profilednn.vocabulary import is_native_conv

from runfactory import make_run

F = "['float', 'float', '', 'ScalarList', 'ScalarList', 'ScalarList', 'Scalar', 'ScalarList', 'Scalar']"
FB = "['float', 'float', 'float', 'ScalarList', 'ScalarList', 'ScalarList', 'Scalar', 'ScalarList', 'Scalar']"
B = "['float', 'float', 'float', 'ScalarList', 'ScalarList', 'ScalarList', 'ScalarList', 'Scalar', 'ScalarList', 'Scalar', 'ScalarList']"
OPS_SCHEMA = {"op": pl.Utf8, "module": pl.Utf8, "phase": pl.Utf8, "input_shapes": pl.Utf8,
              "dtypes": pl.Utf8, "step": pl.Int64, "calls": pl.Int64, "self_time_ms": pl.Float64,
              "total_time_ms": pl.Float64, "onednn_ms": pl.Float64}


def _op(op, module, phase, shapes="[]", dtypes="[]", calls=1, self_ms=0.0, total_ms=None,
        onednn=0.0, step=0):
    return {"op": op, "module": module, "phase": phase, "input_shapes": shapes, "dtypes": dtypes,
            "step": step, "calls": calls, "self_time_ms": self_ms,
            "total_time_ms": self_ms if total_ms is None else total_ms, "onednn_ms": onednn}


def _ops() -> pl.DataFrame:
    """One step: conv1 (7x7 s2 p3 from the image), a 1x1 conv in the native kernel, a ReLU."""
    x1, w1, o1 = "[2, 3, 32, 32]", "[8, 3, 7, 7]", "[2, 8, 16, 16]"
    w2, o2 = "[4, 8, 1, 1]", "[2, 4, 16, 16]"
    rows = [
        _op("aten::convolution", "conv1", "forward", f"[{x1}, {w1}, [], [], [], [], [], [], []]", F,
            self_ms=0.1, total_ms=4.0),
        _op("aten::mkldnn_convolution", "conv1", "forward", self_ms=3.9, onednn=3.5),
        _op("aten::convolution", "conv2", "forward", f"[{o1}, {w2}, [4], [], [], [], [], [], []]", FB,
            self_ms=0.1, total_ms=2.0),
        _op("aten::_slow_conv2d_forward", "conv2", "forward", self_ms=1.9),
        _op("aten::relu", "relu", "forward", f"[{o2}]", "['float']", self_ms=1.0),
        _op("aten::empty", "relu", "forward", calls=10, self_ms=0.5),
        _op("aten::convolution_backward", "conv2", "backward",
            f"[{o2}, {o1}, {w2}, [], [], [], [], [], [], [], []]", B, self_ms=0.2, total_ms=5.0),
        _op("aten::_slow_conv2d_backward", "conv2", "backward", self_ms=4.8),
        _op("aten::convolution_backward", "conv1", "backward",
            f"[{o1}, {x1}, {w1}, [], [], [], [], [], [], [], []]", B, self_ms=6.0, total_ms=6.0,
            onednn=5.5),
    ]
    return pl.DataFrame(rows, schema=OPS_SCHEMA)


STEPS = pl.DataFrame({"step": [0], "time_ms": [25.0], "data_ms": [0.5], "forward_ms": [10.0],
                      "loss_ms": [0.0], "backward_ms": [13.0], "optimizer_ms": [0.0],
                      "other_ms": [0.0]})


def test_conv_geometry_recovers_stride_and_padding():
    assert conv_geometry([112, 112], [56, 56], [7, 7]) == ([2, 2], [3, 3])
    assert conv_geometry([56], [28], [3]) == ([2], [1])
    assert conv_geometry([56], [28], [1]) == ([2], [0])
    assert conv_geometry([28], [28], [3]) == ([1], [1])
    assert conv_geometry([28], [26], [3]) == ([1], [0])
    assert conv_geometry([4], [9], [3]) is None


def test_conv_calls_build_whole_call_cases():
    cases, calls = conv_calls(_ops(), pl.DataFrame())
    by_id = {c["id"]: c for c in cases}
    rows = {(r["op"], r["input_shapes"][:15]): r for r in calls.iter_rows(named=True)}
    assert calls.height == 4 and len(cases) == 4
    fwd1 = by_id[rows[("aten::convolution", "[[2, 3, 32, 32]")]["case_id"]]
    assert (fwd1["direction"], fwd1["s"], fwd1["p"], fwd1["out"]) == ("FWD_D", [2, 2], [3, 3], [16, 16])
    fwd2 = by_id[rows[("aten::convolution", "[[2, 8, 16, 16]")]["case_id"]]
    assert fwd2["direction"] == "FWD_B" and fwd2["bias"] and fwd2["k"] == [1, 1]
    bwd = {r["input_shapes"][:15]: r for r in calls.filter(
        pl.col("op") == "aten::convolution_backward").iter_rows(named=True)}
    assert by_id[bwd["[[2, 4, 16, 16]"]["case_id"]]["direction"] == "BWD_DWB"
    first = bwd["[[2, 8, 16, 16]"]
    assert by_id[first["case_id"]]["direction"] == "BWD_W"  # the image needs no gradient
    assert "input gradient" in first["note"]
    paths = dict(zip(calls["input_shapes"], calls["in_situ_path"]))
    assert paths[rows[("aten::convolution", "[[2, 8, 16, 16]")]["input_shapes"]] == \
        "aten::_slow_conv2d_forward"
    assert paths[rows[("aten::convolution", "[[2, 3, 32, 32]")]["input_shapes"]] == "oneDNN"


def _fake_replay(calls: pl.DataFrame, per_call_ms: float) -> ReplayResult:
    cases = {cid: {"id": cid, "wall_ms": [per_call_ms] * 3,
                   "ops": [["aten::mkldnn_convolution", per_call_ms]]}
             for cid in calls["case_id"].to_list()}
    return ReplayResult(cases=cases, log=pl.DataFrame(), threads=2)


def test_step_parts_add_up_to_the_measured_step_and_replace_only_kernels():
    ops = _ops()
    _, calls = conv_calls(ops, pl.DataFrame())
    calls = attach_conv_replay(calls, _fake_replay(calls, 1.0), steps=1)
    otab = pl.DataFrame({"op": ["aten::relu"], "input_shapes": ["[[2, 4, 16, 16]]"],
                         "dtypes": ["['float']"], "replay_ms": [0.25]})
    parts = step_parts(STEPS, ops, pl.DataFrame(), pl.DataFrame(), otab, calls)
    assert parts["in_situ_ms"].sum() == pytest.approx(25.0)  # the model covers the step
    part = {r["part"]: r for r in by_part(parts).iter_rows(named=True)}
    assert part["conv calls"]["in_situ_ms"] == pytest.approx(17.0)
    assert part["conv calls"]["projected_ms"] == pytest.approx(4.0)  # 4 calls x 1 ms
    assert part["native kernels"]["projected_ms"] == pytest.approx(0.25)
    # everything but the kernels stays: 25 - 17 - 1 = 7 ms
    assert parts["projected_ms"].sum() == pytest.approx(4.0 + 0.25 + 7.0)
    assert part["other ops"]["in_situ_ms"] == pytest.approx(0.5)
    phases = dict(by_phase(parts).select("phase", "in_situ_ms").iter_rows())
    assert phases["forward"] == pytest.approx(10.0) and phases["data"] == pytest.approx(0.5)
    assert parts["assumption"].null_count() == 0
    summary = step_summary(parts, calls)
    assert summary["projected_step_ms"] == pytest.approx(11.25)
    assert summary["native_conv_in_situ_ms"] == pytest.approx(7.0)  # conv2 fwd + bwd
    assert summary["native_conv_projected_ms"] == 0.0
    assert summary["conv_calls_switching_path"] == 2


def test_unreplayed_items_keep_their_in_situ_time():
    ops = _ops()
    _, calls = conv_calls(ops, pl.DataFrame())
    calls = attach_conv_replay(calls, None, steps=1)
    parts = step_parts(STEPS, ops, pl.DataFrame(), pl.DataFrame(), pl.DataFrame(), calls)
    assert parts["projected_ms"].sum() == pytest.approx(25.0)


def test_whatif_step_scales_only_kernel_parts():
    parts = pl.DataFrame({"phase": ["forward"] * 3, "part": ["conv calls", "native kernels", "other ops"],
                          "in_situ_ms": [10.0, 2.0, 3.0], "projected_ms": [8.0, 2.0, 3.0],
                          "calls": [1.0, 1.0, 1.0], "assumption": ["a", "b", "c"]})
    assert whatif_step(parts, {"conv calls": 0.5, "native kernels": 2.0}) == pytest.approx(11.0)


def test_target_path_names_the_native_kernel():
    assert target_path({"ops": [["aten::_slow_conv2d_forward", 1.0]]}, pl.DataFrame(), "c0") == \
        "aten::_slow_conv2d_forward"
    assert target_path({"ops": [["aten::mkldnn_convolution", 1.0]]}, pl.DataFrame(), "c0") == "oneDNN"
    assert target_path({"error": "boom"}, pl.DataFrame(), "c0") is None
    assert is_native_conv("aten::thnn_conv2d") and not is_native_conv("aten::mkldnn_convolution")


def test_replayed_conv_call_takes_pytorchs_path_at_one_thread():
    """At 1 thread PyTorch runs a 1x1 stride-1 conv at batch < 16 natively, a 3x3 in oneDNN."""
    base = {"kind": "conv", "transposed": False, "mb": 2, "g": 1, "ic": 8, "oc": 8,
            "in": [8, 8], "out": [8, 8], "s": [1, 1], "d": [1, 1], "output_padding": [0, 0],
            "bias": False, "dtype": "f32", "channels_last": False, "profile_ops": True}
    cases = [{**base, "id": "c0", "direction": "FWD_D", "k": [1, 1], "p": [0, 0]},
             {**base, "id": "c1", "direction": "BWD_DW", "k": [1, 1], "p": [0, 0]},
             {**base, "id": "c2", "direction": "FWD_D", "k": [3, 3], "p": [1, 1]}]
    res = run_worker(cases, 1, budget_s=0.01, min_reps=2, max_reps=3)
    assert target_path(res.cases["c0"], res.log, "c0") == "aten::_slow_conv2d_forward"
    assert target_path(res.cases["c1"], res.log, "c1") == "aten::_slow_conv2d_backward"
    assert target_path(res.cases["c2"], res.log, "c2") == "oneDNN"
    assert all(res.wall_ms(c) > 0 for c in ("c0", "c1", "c2"))


# ------------------------------------------------------------------------- advice
def test_fallback_cause_follows_pytorchs_rule():
    fwd = "[[2, 64, 8, 8], [64, 64, 1, 1], [], [], [], []]"
    assert fallback_cause("aten::_slow_conv2d_forward", fwd, None, threads=1) == "threads"
    assert fallback_cause("aten::_slow_conv2d_forward", fwd, None, threads=2) == "?"
    big = "[[16, 64, 8, 8], [64, 64, 1, 1], [], [], [], []]"
    assert fallback_cause("aten::_slow_conv2d_forward", big, None, threads=1) == "?"
    bwd = "[[1, 4, 8, 8], [1, 4, 8, 8], [4, 4, 3, 3], [], [], [], []]"
    assert fallback_cause("aten::_slow_conv2d_backward", bwd, None, threads=2) == "batch"
    assert fallback_cause("aten::_slow_conv2d_forward", fwd, "['double', 'double']", 2) == "dtype"


def test_native_conv_advice_names_share_cause_and_action(tmp_path):
    run = make_run(tmp_path, threads=1, native_conv=("layer1.0.conv1", "layer1.0.conv2"))
    (adv,) = [a for a in advise(Analysis(run.path)) if a.rule == "native_conv_fallback"]
    assert "_slow_conv2d_backward" in adv.evidence and "1 thread" in adv.evidence
    assert "% of the step" in adv.evidence
    assert ">= 2 threads" in adv.action and "channels_last does not" in adv.action
    # the share is the fallback ops' time over the step
    ops = Analysis(run.path).ops
    slow = ops.filter(pl.col("op").str.contains("slow_conv"))["self_time_ms"].sum() / 3
    step = Analysis(run.path).step_ms
    assert f"{100 * slow / step:.1f}%" in adv.evidence


def test_native_conv_advice_is_quiet_without_fallback_ops(tmp_path):
    assert "native_conv_fallback" not in {a.rule for a in advise(make_run(tmp_path, threads=1))}

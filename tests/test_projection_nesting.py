"""The step model counts every call once and rebuilds each conv call right (nesting, geometry)."""

from __future__ import annotations

import polars as pl
import pytest

from profilednn.projection.nesting import nested_calls, per_unique_op, taken_out
from profilednn.projection.replay import ReplayResult
from profilednn.projection.step_model import (
    attach_conv_replay, by_part, call_case_ids, conv_calls, native_calibration, step_parts,
)

F = "['float', 'float', 'float', 'ScalarList', 'ScalarList', 'ScalarList', 'Scalar', 'ScalarList', 'Scalar']"
B = "['float', 'float', 'float', 'ScalarList', 'ScalarList', 'ScalarList', 'ScalarList', 'Scalar', 'ScalarList', 'Scalar', 'ScalarList']"
OPS_SCHEMA = {"op": pl.Utf8, "module": pl.Utf8, "phase": pl.Utf8, "input_shapes": pl.Utf8,
              "dtypes": pl.Utf8, "step": pl.Int64, "calls": pl.Int64, "self_time_ms": pl.Float64,
              "total_time_ms": pl.Float64, "onednn_ms": pl.Float64}
X = "[[2, 4, 8, 8]]"
FL = "['float']"


def _event(eid, op, parent, self_ms, module="m", phase="forward", shapes=X, dtypes=FL):
    return {"event_id": eid, "op": op, "parent": parent, "self_ms": self_ms, "module": module,
            "phase": phase, "input_shapes": shapes, "dtypes": dtypes, "step": 0}


def _events() -> pl.DataFrame:
    """relu_ -> clamp_min_; conv backward -> fill_ and clone -> copy_; a relu_ on its own."""
    rows = [
        _event(0, "aten::relu_", -1, 0.1, module="act"),
        _event(1, "aten::clamp_min_", 0, 2.0, module="act"),
        _event(2, "aten::convolution_backward", -1, 0.2, module="conv", phase="backward",
               shapes="[big]", dtypes="[b]"),
        _event(3, "aten::fill_", 2, 0.5, module="conv", phase="backward"),
        _event(4, "aten::clone", 2, 0.1, module="conv", phase="backward"),
        _event(5, "aten::copy_", 4, 0.7, module="conv", phase="backward"),
        _event(6, "aten::clamp_min_", -1, 1.0, module="act2"),  # not nested: replayed alone
        _event(7, "aten::empty", 0, 0.01, module="act"),        # not a family op
    ]
    return pl.DataFrame(rows)


def test_nested_calls_name_the_outermost_replayed_container():
    n = nested_calls(_events())
    got = {(r["op"], r["module"]): (r["inside"], r["container"], r["calls"], r["self_ms"])
           for r in n.iter_rows(named=True)}
    assert got == {
        ("aten::clamp_min_", "act"): ("op", "aten::relu_", 1, 2.0),
        ("aten::fill_", "conv"): ("conv", "aten::convolution_backward", 1, 0.5),
        ("aten::clone", "conv"): ("conv", "aten::convolution_backward", 1, 0.1),
        ("aten::copy_", "conv"): ("conv", "aten::convolution_backward", 1, 0.7),  # outermost
    }
    assert nested_calls(pl.DataFrame()).is_empty()
    assert nested_calls(_events().drop("parent")).is_empty()  # no parents: nothing known


def test_a_nested_call_is_covered_only_when_its_container_was_replayed():
    n = nested_calls(_events())
    replayed = pl.DataFrame({"op": ["aten::relu_"], "input_shapes": [X], "dtypes": [FL],
                             "replay_ms": [1.0]})
    out = {r["op"]: r for r in taken_out(n, replayed).iter_rows(named=True)}
    assert out["aten::clamp_min_"]["covered_calls"] == 1
    assert out["aten::fill_"]["conv_calls"] == 1 and out["aten::fill_"]["conv_ms"] == 0.5
    failed = replayed.with_columns(pl.lit(None, pl.Float64).alias("replay_ms"))
    out = {r["op"]: r for r in taken_out(n, failed).iter_rows(named=True)}
    assert out["aten::clamp_min_"]["covered_calls"] == 0  # its own replay must count
    per = {r["op"]: r for r in per_unique_op(taken_out(n, replayed), steps=2).iter_rows(named=True)}
    assert per["aten::clamp_min_"]["nested_calls_per_step"] == 0.5
    assert per["aten::copy_"]["conv_ms_per_step"] == pytest.approx(0.35)


def _ops_of(events: pl.DataFrame, conv_total: float) -> pl.DataFrame:
    ops = (events.group_by("op", "module", "phase", "input_shapes", "dtypes", "step")
           .agg(pl.len().cast(pl.Int64).alias("calls"), pl.col("self_ms").sum().alias("self_time_ms"))
           .with_columns(pl.col("self_time_ms").alias("total_time_ms"), pl.lit(0.0).alias("onednn_ms")))
    ops = ops.with_columns(pl.when(pl.col("op") == "aten::convolution_backward")
                           .then(pl.lit(conv_total)).otherwise(pl.col("total_time_ms"))
                           .alias("total_time_ms"))
    return ops.select(*OPS_SCHEMA).cast(OPS_SCHEMA)


def test_step_parts_replay_each_native_call_once():
    ev = _events()
    ops = _ops_of(ev, conv_total=1.5)  # conv backward inclusive: 0.2 + 0.5 + 0.1 + 0.7
    steps = pl.DataFrame({"step": [0], "time_ms": [6.0], "forward_ms": [3.5], "backward_ms": [2.0]})
    otab = pl.DataFrame({"op": ["aten::relu_", "aten::clamp_min_", "aten::fill_", "aten::clone",
                                "aten::copy_"],
                         "input_shapes": [X] * 5, "dtypes": [FL] * 5,
                         "replay_ms": [3.0, 2.5, 9.0, 9.0, 9.0]})
    twice = step_parts(steps, ops, pl.DataFrame(), pl.DataFrame(), otab, pl.DataFrame())
    once = step_parts(steps, ops, pl.DataFrame(), pl.DataFrame(), otab, pl.DataFrame(),
                      nested_calls(ev))
    native = {p: float(t.filter(pl.col("part") == "native kernels")[c].sum())
              for p, t in (("twice", twice), ("once", once)) for c in ("projected_ms",)}
    # relu_ (3.0, holding its clamp_min_) + the lone clamp_min_ (2.5); nothing inside the conv
    assert native["once"] == pytest.approx(3.0 + 2.5)
    assert native["twice"] == pytest.approx(3.0 + 2 * 2.5 + 3 * 9.0)
    part = {r["part"]: r for r in by_part(once).iter_rows(named=True)}
    assert part["native kernels"]["in_situ_ms"] == pytest.approx(0.1 + 2.0 + 1.0)
    assert part["native kernels"]["calls"] == pytest.approx(3)
    assert once["in_situ_ms"].sum() == pytest.approx(6.0)  # still the measured step


def _conv_root(module: str, calls: int, total: float, phase: str = "forward") -> dict:
    x, w, b = "[2, 8, 4, 4]", "[8, 8, 3, 3]", "[8]"
    return {"op": "aten::convolution", "module": module, "phase": phase,
            "input_shapes": f"[{x}, {w}, {b}, [], [], [], [], [], []]", "dtypes": F, "step": 0,
            "calls": calls, "self_time_ms": 0.0, "total_time_ms": total, "onednn_ms": 0.0}


def _backward_of(module: str, out_hw: int) -> dict:
    x, w, go = "[2, 8, 4, 4]", "[8, 8, 3, 3]", f"[2, 8, {out_hw}, {out_hw}]"
    return {"op": "aten::convolution_backward", "module": module, "phase": "backward",
            "input_shapes": f"[{go}, {x}, {w}, [8], [], [], [], [], [], [], []]", "dtypes": B,
            "step": 0, "calls": 1, "self_time_ms": 0.0, "total_time_ms": 0.0, "onednn_ms": 0.0}


def test_conv_calls_of_equal_shapes_in_two_modules_are_counted_once_each():
    # RetinaNet: the head's 3x3 convs (stride 1) and P7 (stride 2) take the same tensors
    ops = pl.DataFrame([_conv_root("head", 4, 8.0), _conv_root("p7", 1, 1.0),
                        _backward_of("head", 4), _backward_of("p7", 2)], schema=OPS_SCHEMA)
    cases, calls = conv_calls(ops, pl.DataFrame())
    fwd = calls.filter(pl.col("op") == "aten::convolution")
    assert fwd.height == 2  # two cases: stride 1 and stride 2
    by_id = {c["id"]: c for c in cases}
    stride = {r["modules"][0]: by_id[r["case_id"]]["s"] for r in fwd.iter_rows(named=True)}
    assert stride == {"head": [1, 1], "p7": [2, 2]}
    ids = call_case_ids(calls)
    assert ids.height == 4 and ids.select("op", "module").n_unique() == 4
    replay = ReplayResult(cases={r["case_id"]: {"id": r["case_id"],
                                                "wall_ms": [1.5 if r["modules"] == ["head"] else 0.5]}
                                 for r in calls.iter_rows(named=True)},
                          log=pl.DataFrame(), threads=2)
    calls = attach_conv_replay(calls, replay, steps=1)
    steps = pl.DataFrame({"step": [0], "time_ms": [10.0], "forward_ms": [9.0]})
    parts = step_parts(steps, ops.filter(pl.col("phase") == "forward"), pl.DataFrame(),
                       pl.DataFrame(), pl.DataFrame(), calls)
    conv = parts.filter(pl.col("part") == "conv calls").row(0, named=True)
    assert conv["in_situ_ms"] == pytest.approx(9.0)  # 8 + 1, not doubled
    assert conv["projected_ms"] == pytest.approx(4 * 1.5 + 1 * 0.5)
    assert conv["calls"] == pytest.approx(5)
    # a table stored before it had modules: each call still counted once (first case)
    old = call_case_ids(calls.drop("modules"))
    assert old.height == old.select("op", "input_shapes", "dtypes").n_unique()


def test_calibration_counts_nested_calls_once():
    otab = pl.DataFrame({"case_id": ["o0", "o1"], "op": ["aten::relu_", "aten::clamp_min_"],
                         "input_shapes": [X, X], "dtypes": [FL, FL],
                         "family": ["elementwise", "elementwise"], "calls_per_step": [2.0, 3.0],
                         "in_situ_total_ms": [1.0, 5.0], "replay_ms": [1.0, 1.0]})
    plain = native_calibration(otab, {"o0": 2.0, "o1": 1.0})
    assert plain["factor"][0] == pytest.approx(6.0 / (2 * 2.0 + 3 * 1.0))
    # two of the three clamp_min_ calls ran inside the relu_ calls; 1 ms of them inside a conv
    nested = otab.with_columns(pl.Series("nested_calls_per_step", [0.0, 2.0]),
                               pl.Series("conv_ms_per_step", [0.0, 1.0]))
    once = native_calibration(nested, {"o0": 2.0, "o1": 1.0})
    assert once["factor"][0] == pytest.approx((6.0 - 1.0) / (2 * 2.0 + 1 * 1.0))


def test_a_frozen_conv_takes_its_output_size_from_its_primitive():
    # torchvision's RetinaNet freezes conv1 and layer1: no backward call records their
    # output size, so without the primitive conv1 (7x7, stride 2) was replayed at stride 1
    prim = {"driver": "conv", "module": "conv1", "direction": "FWD_D", "src_tag": "abcd",
            "dst_tag": "abcd", "mb": 2, "g": 1, "ic": 3, "oc": 8, "ih": 32, "iw": 32, "oh": 16,
            "ow": 16, "kh": 7, "kw": 7, "sh": 2, "sw": 2, "dh": 0, "dw": 0, "ph": 3, "pw": 3,
            "src_dt": "f32"}
    row = {"op": "aten::convolution", "module": "conv1", "phase": "forward",
           "input_shapes": "[[2, 3, 32, 32], [8, 3, 7, 7], [], [], [], [], [], [], []]",
           "dtypes": F.replace("'float', 'float', 'float'", "'float', 'float', ''"), "step": 0,
           "calls": 1, "self_time_ms": 1.0, "total_time_ms": 1.0, "onednn_ms": 1.0}
    ops = pl.DataFrame([row], schema=OPS_SCHEMA)
    cases, calls = conv_calls(ops, pl.DataFrame([prim]))
    assert (cases[0]["s"], cases[0]["p"], cases[0]["out"]) == ([2, 2], [3, 3], [16, 16])
    assert calls["note"][0] is None
    cases, calls = conv_calls(ops, pl.DataFrame())  # no primitive: the assumption is said
    assert cases[0]["s"] == [1, 1] and "stride 1" in calls["note"][0]


def test_a_backward_computes_the_input_gradient_only_where_onednn_did():
    # RetinaNet's layer2.0.conv1 follows the frozen layer1: its backward is BWD_W alone
    def prim(direction: str) -> dict:
        return {"driver": "conv", "module": "l2", "direction": direction, "src_tag": "abcd",
                "dst_tag": "abcd", "mb": 2, "g": 1, "ic": 8, "oc": 8, "ih": 8, "iw": 8, "oh": 8,
                "ow": 8, "kh": 1, "kw": 1, "sh": 1, "sw": 1, "dh": 0, "dw": 0, "ph": 0, "pw": 0,
                "src_dt": "f32"}
    x, w = "[2, 8, 8, 8]", "[8, 8, 1, 1]"
    bwd = {"op": "aten::convolution_backward", "module": "l2", "phase": "backward",
           "input_shapes": f"[{x}, {x}, {w}, [], [], [], [], [], [], [], []]", "dtypes": B,
           "step": 0, "calls": 1, "self_time_ms": 1.0, "total_time_ms": 1.0, "onednn_ms": 1.0}
    ops = pl.DataFrame([bwd], schema=OPS_SCHEMA)
    cases, calls = conv_calls(ops, pl.DataFrame([prim("FWD_D"), prim("BWD_W")]))
    assert cases[0]["direction"] == "BWD_W" and calls["note"][0] is None
    cases, _ = conv_calls(ops, pl.DataFrame([prim("FWD_D"), prim("BWD_W"), prim("BWD_D")]))
    assert cases[0]["direction"] == "BWD_DW"
    cases, _ = conv_calls(ops, pl.DataFrame())  # nothing known: C > 4 needs the gradient
    assert cases[0]["direction"] == "BWD_DW"

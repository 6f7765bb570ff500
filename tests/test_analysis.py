"""Breakdowns of one Run: driver x direction, ops, layers, phases, coverage, fwd/bwd."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from profilednn import Analysis, RunError, load_run
from profilednn.errors import InputError

from runfactory import make_run

FIXTURE_LOG = Path(__file__).parent / "fixtures" / "verbose" / "torch2.14_onednn3.12_small.log"


@pytest.fixture(scope="module")
def nchw(tmp_path_factory) -> Analysis:
    return Analysis(make_run(tmp_path_factory.mktemp("runs"), layout="nchw", frozen_bn=True).path)


def test_warmup_rows_are_left_out(nchw):
    raw = load_run(nchw.path).primitives
    assert raw["step"].null_count() > 0  # the factory keeps a warm-up step without index
    assert nchw.primitives["step"].null_count() == 0
    assert nchw.n_steps == 3


def test_driver_direction_breakdown(nchw):
    dd = nchw.by_driver_direction()
    keys = set(zip(dd["driver"].to_list(), dd["direction"].to_list()))
    assert {("conv", "FWD_B"), ("conv", "BWD_D"), ("conv", "BWD_W"), ("reorder", None)} <= keys
    # conv1 (first layer) has no data gradient: 4 convolutions forward, 3 BWD_D
    calls = {(r["driver"], r["direction"]): r["calls_per_step"] for r in dd.iter_rows(named=True)}
    assert calls[("conv", "FWD_B")] == 4 and calls[("conv", "BWD_D")] == 3
    total = nchw.primitives["time_ms"].sum() / nchw.n_steps
    assert dd["ms_per_step"].sum() == pytest.approx(total)
    assert dd["share_pct"].sum() == pytest.approx(total / nchw.step_ms * 100)


def test_dtype_impl_and_problem_breakdowns(nchw):
    di = nchw.by_dtype_impl()
    assert set(di["cfg"].to_list()) == {"f32"}
    assert "jit:avx2" in di["impl"].to_list()
    assert nchw.by_problem()["problem"].str.contains("mb4_ic16oc16").any()


def test_op_breakdown_splits_onednn_and_native(nchw):
    ops = nchw.by_op()
    conv = ops.filter(pl.col("op") == "aten::mkldnn_convolution").row(0, named=True)
    assert conv["onednn_ms"] > 0.9 * conv["self_ms"]
    mul = ops.filter(pl.col("op") == "aten::mul").row(0, named=True)
    assert mul["onednn_ms"] == 0 and mul["native_ms"] == pytest.approx(mul["self_ms"])
    wrapper = ops.filter(pl.col("op").str.starts_with("autograd::engine")).row(0, named=True)
    assert wrapper["native_ms"] == 0 and wrapper["overhead_ms"] == pytest.approx(wrapper["self_ms"])


def test_phase_breakdown_adds_up_to_the_step(nchw):
    phases = nchw.by_phase()
    assert phases["ms_per_step"].sum() == pytest.approx(nchw.step_ms)
    assert phases["share_pct"].sum() == pytest.approx(100.0)
    assert {"forward", "backward", "loss", "optimizer", "data"} <= set(phases["phase"].to_list())


def test_coverage_adds_up_to_the_step(nchw):
    cov = nchw.coverage()
    assert cov["component"].to_list() == ["onednn", "aten", "overhead"]
    assert cov["ms_per_step"].sum() == pytest.approx(nchw.step_ms)
    onednn = cov.filter(pl.col("component") == "onednn")["ms_per_step"][0]
    assert onednn == pytest.approx(nchw.primitives["time_ms"].sum() / nchw.n_steps)
    assert (cov["ms_per_step"] > 0).all()
    by_phase = nchw.coverage_by_phase()
    assert by_phase["onednn_ms"].sum() == pytest.approx(onednn)


def test_coverage_without_ops_is_unattributed(tmp_path):
    a = Analysis(make_run(tmp_path, light=True).path)
    assert a.ops is None and a.op_events is None
    cov = a.coverage()
    assert cov["component"].to_list() == ["onednn", "unattributed"]
    assert cov["ms_per_step"].sum() == pytest.approx(a.step_ms)


def test_layer_breakdowns(nchw):
    lp = nchw.by_layer_phase()
    head = lp.filter((pl.col("module") == "head.cls_logits") & (pl.col("phase") == "forward")).row(0, named=True)
    assert head["calls_per_step"] == 1 and head["leaf"] is True
    assert lp.filter(pl.col("module") == "layer1.0")["leaf"].to_list() == [False, False]
    per_layer = nchw.fwd_bwd_by_layer()
    assert "layer1.0" not in per_layer["module"].to_list()  # leaf modules only
    conv = per_layer.filter(pl.col("module") == "layer1.0.conv1").row(0, named=True)
    assert conv["bwd_fwd_ratio"] > 1.5  # data and weight gradients


def test_fwd_bwd_ratio_levels(nchw):
    r = nchw.fwd_bwd_ratio()
    assert r["level"].to_list() == ["step", "layers", "kernels", "onednn"]
    assert (r["bwd_fwd_ratio"] > 1.0).all()  # CNNs spend more time in backward (seed 000, 2.1)


def test_log_source_has_primitives_only():
    pytest.importorskip("profilednn.verbose.reader")
    a = Analysis(FIXTURE_LOG)
    assert a.is_log and a.n_steps == 1 and a.step_ms is None
    dd = a.by_driver_direction()
    assert {"conv", "reorder"} <= set(dd["driver"].to_list())
    assert a.coverage()["component"].to_list() == ["onednn"]
    assert a.fwd_bwd_ratio()["level"].to_list() == ["onednn"]  # from directions
    with pytest.raises(RunError, match="no ops table"):
        a.by_op()


def test_missing_tables_and_columns_fail_clearly(tmp_path):
    run = make_run(tmp_path, light=True)
    with pytest.raises(RunError, match="no op_events table"):
        Analysis(run.path).fragments()
    run.write_table("ops", pl.DataFrame({"op": ["aten::mul"], "calls": [1]}))
    with pytest.raises(RunError, match="lacks column.*self_time_ms"):
        Analysis(run.path).by_op()


def test_bad_paths_fail_clearly(tmp_path):
    with pytest.raises(InputError, match="no such Run or verbose log"):
        Analysis(tmp_path / "missing")
    with pytest.raises(RunError, match="not a Run"):
        Analysis(tmp_path)


def test_loss_backward_is_found_before_the_first_layer_backward(tmp_path):
    a = Analysis(make_run(tmp_path, loss="focal").path)
    ms, how = a.loss_backward()
    assert "first layer" in how
    # the loss's gradient nodes: top-level backward events outside any module
    nodes = a.op_events.filter(
        (pl.col("phase") == "backward") & pl.col("module").is_null() & (pl.col("depth") == 0)
    )
    busy = float(nodes["dur_ms"].sum()) / a.n_steps
    assert busy <= ms <= busy * 1.1


def test_loss_backward_prefers_the_loss_modules_backward_rows(tmp_path):
    run = make_run(tmp_path, loss="focal")
    layers = run.table("layers")
    extra = pl.DataFrame(
        {"module": ["FocalLoss1", "FocalLoss1"], "module_type": ["FocalLoss"] * 2, "phase": ["loss", "backward"],
         "calls": [1, 1], "time_ms": [1.0, 7.5], "params": [0, 0], "trainable_params": [0, 0],
         "leaf": [True, True], "step": [0, 0]},
        schema=layers.schema,
    )
    run.write_table("layers", pl.concat([layers, extra]))
    a = Analysis(run.path)
    ms, how = a.loss_backward()
    assert how == "the loss modules' backward" and ms == pytest.approx(7.5 / a.n_steps)

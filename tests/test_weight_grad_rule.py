"""The ``conv_weight_grad`` advice: which oneDNN primitives count as a 1x1 weight gradient,
and the gain model (each weight gradient at its own shape's forward rate)."""

from __future__ import annotations

import polars as pl
import pytest
from runfactory import FLOP_PER_MS, RunSpec, conv_ms, make_run, model

from profilednn.analysis import Analysis, advise
from profilednn.analysis.actions import check_action, snippet_callables
from profilednn.analysis.weight_grad_rules import (
    CONV_WEIGHT_GRAD_MIN_PCT,
    pointwise_convolutions,
    shape_label,
    weight_grad_shapes,
)
from profilednn.tables import PRIMITIVES

POINTWISE = ("layer1.0.conv1", "layer1.0.conv2")


def _conv(prop: str, ms: float, flops: float, *, ic: int = 64, oc: int = 256, h: int = 14, k: int = 1,
          g: int = 1, p: int = 0, d: int = 0, s: int = 1, dt: str = "bf16", step: int = 0) -> dict:
    o = (h + 2 * p - k) // s + 1
    return {"prim_kind": "convolution", "driver": "conv", "prop_kind": prop, "impl": "brgconv:avx512_core_amx",
            "src_dt": dt, "src_tag": "acdb", "mb": 8, "g": g, "ic": ic, "oc": oc, "id": 1, "ih": h, "iw": h,
            "od": 1, "oh": o, "ow": o, "kd": 1, "kh": k, "kw": k, "sd": 1, "sh": s, "sw": s, "dd": 0, "dh": d,
            "dw": d, "pd": 0, "ph": p, "pw": p, "time_ms": ms, "flops": flops, "step": step}


def _table(rows: list[dict]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=PRIMITIVES.schema)


def test_only_undilated_unpadded_one_group_1x1_convolutions_count() -> None:
    rows = [
        _conv("backward_weights", 1.0, 1e9),
        _conv("backward_weights", 1.0, 1e9, k=3, p=1),  # 3x3
        _conv("backward_weights", 1.0, 1e9, g=4),  # grouped
        _conv("backward_weights", 1.0, 1e9, p=1),  # padded
        _conv("backward_weights", 1.0, 1e9, d=1),  # dilated (oneDNN counts from 0)
        {**_conv("backward_weights", 1.0, 1e9), "sw": 2},  # strides differ
        {**_conv("backward_weights", 1.0, 1e9), "prim_kind": "deconvolution"},
    ]
    kept = pointwise_convolutions(_table(rows))
    assert kept.height == 1 and kept.row(0, named=True)["kh"] == 1 and kept.row(0, named=True)["g"] == 1
    strided = pointwise_convolutions(_table([_conv("backward_weights", 1.0, 1e9, s=2)]))
    assert strided.height == 1  # a stride-2 1x1 (ResNet's downsample) is taken


def test_each_weight_gradient_is_priced_at_its_own_shapes_forward_rate() -> None:
    rows = [
        # 64->256: forward 1e9 FLOPs in 0.5 ms (2 TFLOP/s); weight gradient 1e9 FLOPs in 2 ms, two steps
        *[_conv("forward_training", 0.5, 1e9, step=i) for i in (0, 1)],
        *[_conv("backward_weights", 2.0, 1e9, step=i) for i in (0, 1)],
        # 256->64: the weight gradient is faster than its forward: it adds nothing
        *[_conv("forward_training", 1.0, 1e9, ic=256, oc=64, step=i) for i in (0, 1)],
        *[_conv("backward_weights", 0.8, 1e9, ic=256, oc=64, step=i) for i in (0, 1)],
        # 128->512 has no forward of the same problem (another dtype's is not one): left out
        *[_conv("backward_weights", 5.0, 1e9, ic=128, oc=512, step=i) for i in (0, 1)],
        *[_conv("forward_training", 0.1, 1e9, ic=128, oc=512, dt="f32", step=i) for i in (0, 1)],
        # the data gradient is neither
        *[_conv("backward_data", 9.0, 1e9, step=i) for i in (0, 1)],
    ]
    shapes = weight_grad_shapes(_table(rows), n_steps=2)
    assert shapes.height == 2
    worst, other = shapes.rows(named=True)
    assert (worst["ic"], worst["oc"], other["ic"], other["oc"]) == (64, 256, 256, 64)
    assert worst["shape_calls"] == 1 and worst["bwd_ms"] == pytest.approx(2.0)
    assert worst["gemm_ms"] == pytest.approx(0.5) and worst["gain_ms"] == pytest.approx(1.5)
    assert other["gemm_ms"] == pytest.approx(1.0) and other["gain_ms"] == 0.0
    assert shape_label(worst) == "64->256 at 14x14, batch 8"
    assert shape_label({**worst, "sh": 2}) == "64->256 at 14x14, stride 2, batch 8"
    # a weight gradient with no forward at all: nothing to estimate
    assert weight_grad_shapes(_table([_conv("backward_weights", 5.0, 1e9)]), n_steps=1).height == 0


def test_the_rule_gains_the_weight_gradients_time_above_the_forward_rate(tmp_path) -> None:
    scale = 4.0
    a = Analysis(make_run(tmp_path, pointwise=POINTWISE, pointwise_wgrad_scale=scale).path)
    (adv,) = [x for x in advise(a) if x.rule == "conv_weight_grad"]
    spec = RunSpec(pointwise=POINTWISE)
    one = [conv_ms(spec, m) for m in model(spec) if m.path in POINTWISE]
    assert adv.estimated_gain_pct == pytest.approx(sum(one) * (scale - 1) / a.step_ms * 100)
    gflops = FLOP_PER_MS / 1e6
    assert (f"at {gflops / scale:.0f} GFLOP/s, where the same shapes' forward convolutions, a GEMM of the same "
            f"FLOPs, run at {gflops:.0f} GFLOP/s") in adv.evidence
    assert "2 calls per step over 1 shape(s)" in adv.evidence and "The shape: 16->16 at 32x32, batch 4" in adv.evidence
    assert "profilednn.kernels.pointwise_gemms" in snippet_callables(adv.action) and not check_action(adv.action)
    assert "It needs channels_last" in adv.action
    assert "not channels_last" not in adv.action  # this Run's activations are NHWC already


def test_the_rule_waits_for_its_threshold_and_says_when_activations_are_not_channels_last(tmp_path) -> None:
    a = Analysis(make_run(tmp_path / "small", pointwise=POINTWISE, pointwise_wgrad_scale=1.5).path)
    shapes = weight_grad_shapes(a.primitives, a.n_steps)
    assert 0 < shapes["gain_ms"].sum() / a.step_ms * 100 < CONV_WEIGHT_GRAD_MIN_PCT
    assert "conv_weight_grad" not in {x.rule for x in advise(a)}
    nchw = Analysis(make_run(tmp_path / "nchw", pointwise=POINTWISE, pointwise_wgrad_scale=8.0, layout="nchw").path)
    (adv,) = [x for x in advise(nchw) if x.rule == "conv_weight_grad"]
    assert "activations reach oneDNN as aBcd8b, not channels_last: apply channels_last first" in adv.action

"""Headroom after optimize: the optimized step split by op family (``op_families.py``), its
profile (``headroom.py``), the report key, the Run table, the printers and the CLI switch
(tiny models; no assertion on wall-clock time)."""

from __future__ import annotations

import json

import polars as pl
import pytest
import torch
from rich.console import Console
from torch import nn

import profilednn
from profilednn.cli import run_cli
from profilednn.optimization import Settings, TrainStep, optimize_workload
from profilednn.optimization.headroom import Headroom, measure_headroom
from profilednn.optimization.op_families import FAMILIES, classify, event_family, family_split
from profilednn.optimization.report import report_sections
from profilednn.optimization.terminal import print_headroom
from profilednn.run import load_run
from profilednn.tables import OPTIMIZE_HEADROOM

FAST = dict(rounds=2, warmup=0, numerics_steps=2, measure_flops=False, calibrate_noise=False)


def tiny_setup() -> TrainStep:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(64, 3))
    g = torch.Generator().manual_seed(1)
    batch = (torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 3, (4,), generator=g))
    return TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), nn.CrossEntropyLoss(),
                      [batch])


# ------------------------------------------------------------------------- the vocabulary
@pytest.mark.parametrize("name, family", [
    ("aten::convolution_backward", "gemm"), ("aten::mkldnn_convolution", "gemm"), ("aten::conv2d", "gemm"),
    ("aten::_slow_conv2d_forward", "gemm"), ("aten::addmm", "gemm"), ("aten::mm", "gemm"),
    ("mkldnn::_convolution_pointwise", "gemm"), ("aten::linear", "gemm"),
    ("aten::native_batch_norm", "batch_norm"), ("aten::native_batch_norm_backward", "batch_norm"),
    ("aten::_batch_norm_with_update", "batch_norm"), ("profilednn::bn_act_forward", "batch_norm"),
    ("profilednn::bn_act_backward", "batch_norm"), ("GeneratedBackwardFor_profilednn_bn_act_forward_default", "batch_norm"),
    ("aten::clamp_min_", "elementwise"), ("aten::threshold_backward", "elementwise"), ("aten::add_", "elementwise"),
    ("aten::gelu_backward", "elementwise"), ("aten::native_dropout", "elementwise"),
    ("aten::native_layer_norm", "reduce_norm"), ("aten::_softmax", "reduce_norm"), ("aten::sum", "reduce_norm"),
    ("aten::max_pool2d_with_indices_backward", "pooling"), ("aten::_adaptive_avg_pool2d", "pooling"),
    ("aten::copy_", "copy_layout"), ("aten::_to_copy", "copy_layout"), ("aten::clone", "copy_layout"),
    ("aten::nll_loss_backward", "loss"), ("aten::binary_cross_entropy_with_logits", "loss"),
    ("aten::_foreach_add_", "optimizer"), ("aten::_fused_sgd_", "optimizer"), ("Optimizer.step#SGD.step", "optimizer"),
    ("## Call CompiledFxGraph fdpbdg ##", "compiled"),
    ("aten::empty", None), ("aten::view", None), ("aten::_convert_indices_from_coo_to_csr", None),
    ("autograd::engine::evaluate_function: ConvolutionBackward0", None), ("ConvolutionBackward0", None),
    ("profilednn::step", None),
])
def test_event_family_names_the_family_of_each_kind_of_op(name, family):
    assert event_family(name) == family
    assert family is None or family in FAMILIES


def _events(rows: list[tuple[str, float, float, int]]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema={"op": pl.Utf8, "self_ms": pl.Float64, "dur_ms": pl.Float64,
                                      "parent": pl.Int64}, orient="row")


def _step(base: int, conv: float) -> list[tuple[str, float, float, int]]:
    """One profiled step as torch.profiler nests it (rows; parents as indices from ``base``)."""
    return [
        ("profilednn::step", 0.5, 10.5 + conv, -1),                      # base: gaps between ops
        ("aten::conv2d", 0.1, 2.0 + conv, base),                         # +1
        ("aten::mkldnn_convolution", 1.7 + conv, 1.9 + conv, base + 1),  # +2
        ("aten::empty", 0.2, 0.2, base + 2),                             # +3: the conv's
        ("aten::native_batch_norm", 2.0, 2.0, base),                     # +4
        ("profilednn::loss", 0.1, 1.0, base),                            # +5
        ("aten::_log_softmax", 0.9, 0.9, base + 5),                      # +6: in the loss
        ("autograd::engine::evaluate_function: ReluBackward0", 0.3, 1.3, base),  # +7: overhead
        ("aten::threshold_backward", 1.0, 1.0, base + 7),                # +8
        ("Optimizer.step#SGD.step", 0.4, 3.7, base),                     # +9
        ("aten::add_", 3.0, 3.3, base + 9),                              # +10: the optimizer's
        ("aten::copy_", 0.3, 0.3, base + 10),                            # +11: still the optimizer's
    ]


def test_each_events_self_time_goes_to_one_family_and_the_families_add_up_to_the_step():
    rows = [("aten::empty", 5.0, 5.0, -1)] + _step(1, 0.0) + _step(13, 2.0)  # an event outside every step
    done = classify(_events(rows))
    assert done["step"].to_list()[:2] == [None, 0] and done["step"].to_list()[13] == 1
    family = dict(zip(range(len(rows)), done["family"].to_list()))
    assert [family[i] for i in (2, 3, 4, 5, 7, 8, 9, 11, 12)] == [
        "gemm", "gemm", "gemm", "batch_norm", "loss", "other", "elementwise", "optimizer", "optimizer"]

    table, step_ms, steps = family_split(_events(rows))
    assert steps == 2 and step_ms == pytest.approx(11.5)
    ms = dict(zip(table["family"], table["ms_per_step"]))
    assert ms == pytest.approx({"gemm": 3.0, "batch_norm": 2.0, "loss": 1.0, "elementwise": 1.0,
                                "optimizer": 3.7, "other": 0.8})
    assert sum(ms.values()) == pytest.approx(step_ms)  # nothing counted twice, nothing lost
    assert table["family"][0] == "gemm" and table["family"][1] == "optimizer"  # GEMM first, then heaviest
    assert table["share_pct"].sum() == pytest.approx(100.0)
    other = table.filter(pl.col("family") == "other")["top_ops"][0]
    assert other.startswith("(between ops) 0.5") and "autograd ReluBackward0 0.3" in other


def test_the_kernels_custom_ops_are_named_and_only_regions_are_time_between_ops():
    """``profilednn::bn_act_forward`` shares the namespace of ProfileDNN's regions but is an
    op (the fused batch norm's C kernel): its self time is its own, not "(between ops)"."""
    rows = [("profilednn::step", 0.5, 9.5, -1), ("profilednn::bn_act_forward", 6.0, 6.0, 0),
            ("profilednn::data", 1.0, 3.0, 0), ("aten::copy_", 2.0, 2.0, 2)]
    table, _, _ = family_split(_events(rows))
    tops = dict(zip(table["family"], table["top_ops"]))
    assert tops["batch_norm"] == "profilednn::bn_act_forward 6.0"
    assert tops["other"] == "(between ops) 1.5"  # the step's 0.5 and the data region's 1.0


def test_a_profile_without_step_regions_is_refused():
    with pytest.raises(ValueError, match="profilednn::step"):
        family_split(_events([("aten::mm", 1.0, 1.0, -1)]))


# ------------------------------------------------------------------------- the profile
def test_measure_headroom_profiles_the_step_and_weighs_gemm_against_the_peak():
    said: list[str] = []
    headroom, why = measure_headroom(tiny_setup(), 2, {"fp32": 2e6}, {"fp32": 100.0}, said.append,
                                     launch_env={"OMP_PROC_BIND": "close"})
    assert why is None and said and "torch.profiler" in said[0]
    families = set(headroom.families["family"])
    assert {"gemm", "batch_norm", "pooling", "optimizer", "loss"} <= families
    assert headroom.families["ms_per_step"].sum() == pytest.approx(headroom.step_ms, rel=1e-3)
    # 2 MFLOP at 100 GFLOP/s take 0.02 ms: the efficiency is that over the GEMM/conv time
    assert headroom.gemm_efficiency == pytest.approx(0.02 / headroom.gemm_ms)
    assert any("OMP_PROC_BIND=close" in n for n in headroom.notes)
    d = headroom.to_dict()
    assert d["steps_profiled"] == 2 and d["gemm_ms"] + d["outside_gemm_ms"] == pytest.approx(
        sum(f["ms_per_step"] for f in d["families"]))
    assert all(set(f) >= {"family", "ms_per_step", "share_pct"} for f in d["families"])
    table = headroom.table()
    assert OPTIMIZE_HEADROOM.missing_columns(table) == []
    assert table.filter(pl.col("family") == "gemm")["efficiency"][0] == pytest.approx(headroom.gemm_efficiency)
    assert table.filter(pl.col("family") != "gemm")["efficiency"].null_count() == table.height - 1


def test_optimize_reports_the_headroom_and_the_setting_switches_it_off():
    setup = tiny_setup()
    report = profilednn.optimize(setup.model, setup.optimizer, setup.loss_fn, setup.batches[0],
                                 recipes="fused_optimizer", **FAST).report
    d = report.to_dict()
    assert d["headroom"]["families"] and d["headroom"]["gemm_efficiency"] is None  # FLOPs not measured
    assert any("not measured" in n for n in d["headroom"]["notes"])
    off = profilednn.optimize(setup.model, setup.optimizer, setup.loss_fn, setup.batches[0],
                              recipes="fused_optimizer", headroom=False, **FAST).report
    assert off.headroom is None and off.to_dict()["headroom"] is None
    with pytest.raises(profilednn.ProfileDNNError, match="headroom_steps"):
        Settings(headroom_steps=0).check()


# ------------------------------------------------------------------------- Run, printers, CLI
def test_the_run_keeps_the_headroom_table_and_the_report_shows_it(tmp_path, no_bf16_cpu):
    run, result = optimize_workload("small_cnn", tmp_path, "channels_last", settings=Settings(**FAST),
                                    batch_size=4, image_size=16)
    run = load_run(run.path)
    table = run.table(OPTIMIZE_HEADROOM)
    assert OPTIMIZE_HEADROOM.missing_columns(table) == [] and "gemm" in table["family"].to_list()
    assert run.manifest["optimize"]["headroom"]["families"][0]["family"] == "gemm"
    (section,) = report_sections(run)
    assert "Where the optimized step goes" in section.html and "batch_norm" in section.html


def _headroom() -> dict:
    families = pl.DataFrame({
        "family": ["gemm", "batch_norm", "other"], "ms_per_step": [40.0, 35.5, 24.5],
        "share_pct": [40.0, 35.5, 24.5],
        "top_ops": ["convolution_backward 30.1, mkldnn_convolution 9.9",
                    "native_batch_norm_backward 20.0, native_batch_norm 15.5",
                    "(between ops) 20.0, autograd ConvolutionBackward0 4.5"]})
    return Headroom(families, 3, 100.0, gemm_efficiency=0.31, notes=["profiled in this process"]).to_dict()


def test_the_headroom_table_fits_80_columns_and_wide_adds_what_each_family_is():
    narrow = Console(width=80, record=True, markup=False)
    print_headroom(_headroom(), narrow)
    out = narrow.export_text()
    assert "GEMM/conv 40.00 ms/step (40%) at 31.0% of the GEMM peak; outside GEMM 60.00 ms/step (60%)" in \
        out.replace("\n", " ")
    boxed = [line for line in out.splitlines() if line[:1] in set("┏┃┡│└")]
    assert boxed and max(len(line) for line in boxed) <= 80 and not any("…" in line for line in boxed)
    assert "what it is" not in out
    wide = Console(width=80, record=True, markup=False)
    print_headroom(_headroom(), wide, wide=True)
    text = wide.export_text()
    assert "what it is" in text and "framework overhead" in text


def test_cli_optimize_no_headroom(tmp_path, capsys):
    code = run_cli(["optimize", "--model", "small_cnn", "--batch-size", "4", "--image-size", "16",
                    "--recipes", "fused_optimizer", "--rounds", "2", "--warmup", "0", "--numerics-steps", "2",
                    "--no-headroom", "--json", "-o", str(tmp_path)])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert "headroom" in data and data["headroom"] is None
    assert not load_run(data["run"]).has_table(OPTIMIZE_HEADROOM)

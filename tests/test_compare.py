"""Compare two Runs that differ in a known way (seed 000, 2.1-2.2 and Fig 4)."""

from __future__ import annotations

import polars as pl
import pytest

from profilednn import Analysis, compare
from profilednn.analysis.compare import ratio_table

from runfactory import make_run


@pytest.fixture(scope="module")
def classes(tmp_path_factory):
    """RetinaNet-like: the same model with 91 (COCO) vs 264 (OpenImages) classes."""
    d = tmp_path_factory.mktemp("runs")
    coco = make_run(d, workload="retinanet_like", loss="focal", num_classes=91)
    openimages = make_run(d, workload="retinanet_like", loss="focal", num_classes=264)
    return compare(coco.path, openimages.path)


def test_more_classes_grow_the_loss_share(classes):
    phases = classes.phases()
    loss = phases.filter(pl.col("phase") == "loss").row(0, named=True)
    assert loss["b_share_pct"] > loss["a_share_pct"]
    assert loss["ratio"] == pytest.approx(264 / 91, rel=0.05)  # the loss scales with classes
    s = classes.summary()
    assert s["step_ratio"] > 1.5


def test_ratio_contributions_explain_the_whole_change(classes):
    phases = classes.phases()
    assert phases["contribution_pct"].sum() == pytest.approx(100.0, abs=1e-6)
    assert phases["delta_ms"].sum() == pytest.approx(classes.b.step_ms - classes.a.step_ms)
    ops = classes.ops()
    assert ops["contribution_pct"][0] == ops["contribution_pct"].max()  # sorted by |delta|


def test_layer_and_driver_ratios(classes):
    layers = classes.layers()
    head = layers.filter((pl.col("module") == "head.cls_logits") & (pl.col("phase") == "forward")).row(0, named=True)
    assert head["ratio"] == pytest.approx(264 / 91, rel=0.05)
    backbone = layers.filter((pl.col("module") == "layer1.0.conv1") & (pl.col("phase") == "forward")).row(0, named=True)
    assert backbone["ratio"] == pytest.approx(1.0)
    conv = classes.drivers().filter(pl.col("driver") == "conv").row(0, named=True)
    assert conv["ratio"] > 1.0


def test_same_model_has_no_discrepancies(classes):
    assert classes.missing().height == 0
    assert classes.impl_changes().height == 0
    assert classes.elementwise_splits().height == 0


def test_frozen_batchnorm_splits_into_elementwise_kernels(tmp_path):
    ref = make_run(tmp_path, frozen_bn=False)
    custom = make_run(tmp_path, frozen_bn=True)
    cmp = compare(ref.path, custom.path)
    splits = cmp.elementwise_splits()
    assert set(splits["module"].to_list()) == {"bn1", "layer1.0.bn1", "layer1.0.bn2"}
    row = splits.row(0, named=True)
    assert row["split_in"] == "B" and row["b_module_type"] == "FrozenBatchNorm2d"
    assert row["a_kernels"] == "aten::native_batch_norm\u00d71"
    assert "aten::mul\u00d73" in row["b_kernels"] and "aten::add\u00d72" in row["b_kernels"]
    missing = cmp.missing()
    only_a = set(missing.filter(pl.col("only_in") == "A")["name"].to_list())
    only_b = set(missing.filter(pl.col("only_in") == "B")["name"].to_list())
    assert "aten::native_batch_norm" in only_a and "aten::rsqrt" in only_b
    assert "elementwise_split" in {a.rule for a in cmp.advice()}
    # the other way round, the split is in A and B gets no split advice
    back = compare(custom.path, ref.path)
    assert set(back.elementwise_splits()["split_in"].to_list()) == {"A"}
    assert "elementwise_split" not in {a.rule for a in back.advice()}


def test_extra_backward_convolutions_from_frozen_layers(tmp_path):
    ref = make_run(tmp_path, frozen_layers=("conv1", "layer1.0.conv1"))  # no weight gradients
    custom = make_run(tmp_path, frozen_layers=("conv1", "layer1.0.conv1"), frozen_wgrad=True)
    cmp = compare(ref.path, custom.path)
    counts = cmp.call_counts()
    bwd_w = counts.filter((pl.col("kind") == "primitive") & (pl.col("name") == "conv BWD_W")).row(0, named=True)
    assert bwd_w["a_calls_per_step"] == 2 and bwd_w["b_calls_per_step"] == 4
    rules = {a.rule: a for a in cmp.advice()}
    assert "extra_backward_convolutions" in rules and "frozen_weight_grads" in rules
    assert rules["extra_backward_convolutions"].estimated_gain_pct > 0
    assert "extra_backward_convolutions" not in {a.rule for a in compare(custom.path, ref.path).advice()}


def test_layout_change_shows_as_implementation_and_format_change(tmp_path):
    cmp = compare(make_run(tmp_path, layout="nhwc").path, make_run(tmp_path, layout="nchw").path)
    changes = cmp.impl_changes()
    fwd = changes.filter((pl.col("where") == "layer1.0.conv1") & (pl.col("direction") == "FWD_B")).row(0, named=True)
    assert fwd["a_impl"] == "brg_conv_fwd:avx2" and fwd["b_impl"] == "jit:avx2"
    assert "src:acdb" in fwd["a_formats"] and "src:aBcd8b" in fwd["b_formats"]
    reorder = cmp.call_counts().filter(pl.col("name") == "reorder").row(0, named=True)
    assert reorder["b_calls_per_step"] > reorder["a_calls_per_step"]


def test_ratio_table_handles_rows_in_one_side_only():
    a = pl.DataFrame({"k": ["x", "y"], "ms_per_step": [1.0, 2.0]})
    b = pl.DataFrame({"k": ["x", "z"], "ms_per_step": [3.0, 4.0]})
    t = ratio_table(a, b, ["k"])
    rows = {r["k"]: r for r in t.iter_rows(named=True)}
    assert rows["x"]["ratio"] == pytest.approx(3.0)
    assert rows["y"]["b_ms"] == 0.0 and rows["y"]["ratio"] == 0.0
    assert rows["z"]["ratio"] is None and rows["z"]["a_ms"] == 0.0
    assert t["contribution_pct"].sum() == pytest.approx(100.0)


def test_compare_works_with_light_runs(tmp_path):
    cmp = compare(make_run(tmp_path, light=True).path, Analysis(make_run(tmp_path, light=True, num_classes=30).path))
    assert cmp.phases().height > 0 and cmp.drivers().height > 0
    assert set(cmp.call_counts()["kind"].to_list()) <= {"primitive"}

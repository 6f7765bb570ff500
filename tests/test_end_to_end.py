"""Captured Runs through analysis, compare, report and trace: the real chain, no fixtures."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from profilednn import compare, load_run
from profilednn.capture import profile_builtin
from profilednn.cli import run_cli

pytestmark = pytest.mark.zoo  # RetinaNet: torchvision


@pytest.fixture(scope="module")
def retinanet_pair(tmp_path_factory: pytest.TempPathFactory):
    runs = tmp_path_factory.mktemp("retina")
    # 160 px and 3 steps: the loss phase is long enough (several ms) that one scheduler
    # time slice on a busy machine cannot invert the 91 vs 264 comparison.
    knobs = dict(batch_size=1, image_size=160, steps=3, warmup=1, light=True)
    coco = profile_builtin("retinanet_resnext50_fpn", runs, num_classes=91, **knobs)
    openimages = profile_builtin("retinanet_resnext50_fpn", runs, num_classes=264, **knobs)
    return coco, openimages


CLS_LOGITS = "head.classification_head.cls_logits"  # makes the logits the focal loss reads


def _one_step(run) -> pl.DataFrame:
    prims = load_run(run.path).primitives
    return prims.filter(pl.col("step") == prims["step"].max())


def test_more_classes_grow_the_loss_input_and_nothing_else(retinanet_pair) -> None:
    """Seed 000, Fig 4: OpenImages' 264 classes make the focal loss a larger part of the step.

    Times do not show it on every CPU (the classification head grows with the classes too:
    on an Intel AMX guest the loss share of 264 classes came out below that of 91), so the
    Runs are held to what holds anywhere: the loss reads anchors x classes logits, made by
    the head's last convolution (9 anchors x classes output channels), whose FLOPs grow by
    264/91 while every other primitive of the step is the same problem as before.
    """
    coco, openimages = retinanet_pair
    a, b = _one_step(coco), _one_step(openimages)
    head_a, head_b = (df.filter((pl.col("module") == CLS_LOGITS) & (pl.col("driver") == "conv")) for df in (a, b))
    assert set(head_a["oc"]) == {9 * 91} and set(head_b["oc"]) == {9 * 264}
    assert head_a.height == head_b.height > 0
    assert head_b["flops"].sum() / head_a["flops"].sum() == pytest.approx(264 / 91, rel=1e-9)
    rest = [df.filter(pl.col("module").fill_null("") != CLS_LOGITS).select("driver", "direction", "problem",
                                                                           "flops", "bytes").sort(pl.all())
            for df in (a, b)]
    assert rest[0].height > 0 and rest[0].equals(rest[1])
    loss_calls = [load_run(r.path).table("layers").filter(pl.col("phase") == "loss")["calls"].sum()
                  for r in (coco, openimages)]
    assert loss_calls[0] == loss_calls[1] > 0  # the loss ran in every step of both Runs


def test_frozen_layers_compute_no_weight_gradients(retinanet_pair) -> None:
    """conv1 and layer1 are frozen (trainable_layers=3): no backward_weights primitives there."""
    coco, _ = retinanet_pair
    prims = load_run(coco.path).primitives
    bww = prims.filter(pl.col("prop_kind") == "backward_weights")
    assert bww.height > 0
    frozen = bww.filter(pl.col("module").str.contains(r"^backbone\.body\.(conv1$|layer1\.)"))
    assert frozen.height == 0
    trainable = bww.filter(pl.col("module").str.contains(r"^backbone\.body\.layer2\."))
    assert trainable.height > 0


def test_compare_cli_json_and_html(retinanet_pair, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    coco, openimages = retinanet_pair
    out = tmp_path / "cmp.html"
    assert run_cli(["compare", str(coco.path), str(openimages.path), "-o", str(out)]) == 0
    assert out.exists() and out.stat().st_size > 1000
    capsys.readouterr()
    assert run_cli(["compare", str(coco.path), str(openimages.path), "--json"]) == 0
    advice = json.loads(capsys.readouterr().out)
    assert isinstance(advice, list)
    for item in advice:
        assert set(item) == {"rule", "severity", "evidence", "estimated_gain_pct", "action"}


def test_report_and_trace_of_a_captured_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = profile_builtin("small_cnn", tmp_path, steps=2, warmup=1, batch_size=8)
    html = tmp_path / "r.html"
    assert run_cli(["report", str(run.path), "-o", str(html)]) == 0
    text = html.read_text()
    assert "<svg" in text and "http://" not in text.replace("http://www.w3.org", "")
    trace = json.loads((run.path / "trace.json").read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    complete = [e for e in events if e.get("ph") == "X"]
    names = {e["name"] for e in complete}
    assert any(n.startswith("aten::") for n in names)          # framework ops
    assert any("conv" in n or "reorder" in n for n in names)    # oneDNN primitives
    assert {"forward", "backward"} & names                      # phase spans
    capsys.readouterr()
    assert run_cli(["report", str(run.path), "--json"]) == 0
    advice = json.loads(capsys.readouterr().out)
    assert all(set(a) == {"rule", "severity", "evidence", "estimated_gain_pct", "action"} for a in advice)


def test_runs_lists_captured_runs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    profile_builtin("small_cnn", tmp_path, steps=1, warmup=1, batch_size=4, light=True)
    capsys.readouterr()
    assert run_cli(["runs", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "small_cnn" in out and "complete" in out

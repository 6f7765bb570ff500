"""Built-in workloads: every one builds and trains at tiny shapes, deterministically, and
rejects impossible knobs with a WorkloadError."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("torchvision", reason="needs the [zoo] extra (pip install 'profilednn[zoo]')")
from torchvision.ops.misc import FrozenBatchNorm2d  # noqa: E402

from profilednn.errors import WorkloadError
from profilednn.workloads import (
    RetinaNetDense,
    RetinaNetLoss,
    anchor_count,
    build_workload,
    get_spec,
    list_workloads,
)
from profilednn.train_step import TrainStep
from profilednn.workloads.data import IGNORE_INDEX

CONTRACT_NAMES = {
    "small_cnn",
    "resnet50",
    "resnext50_32x4d",
    "alexnet",
    "retinanet_resnext50_fpn",
    "bert_base",
    "lstm_lm",
}

# The smallest sensible shape of each workload (fast on two shared cores).
TINY: dict[str, dict] = {
    "small_cnn": {"batch_size": 2},
    "resnet50": {"batch_size": 2, "image_size": 32},
    "resnext50_32x4d": {"batch_size": 2, "image_size": 32},
    "alexnet": {"batch_size": 2, "image_size": 63},
    "retinanet_resnext50_fpn": {"batch_size": 1, "image_size": 128},
    "bert_base": {"batch_size": 2, "seq_len": 16, "layers": 2, "hidden": 64, "heads": 4},
    "lstm_lm": {"batch_size": 2, "seq_len": 8, "hidden": 32, "vocab_size": 100},
}


def test_registry_holds_the_contract_names_with_consistent_specs():
    specs = list_workloads()
    assert {spec.name for spec in specs} == CONTRACT_NAMES
    for spec in specs:
        assert set(spec.defaults) == set(spec.knobs)
        assert "batch_size" in spec.knobs
        assert (spec.min_image_size is not None) == ("image_size" in spec.knobs)
        assert spec.to_dict()["common_knobs"] == ["dtype", "channels_last", "seed"]


@pytest.mark.parametrize("name", sorted(TINY))
def test_each_workload_builds_and_trains_two_steps(name):
    workload = build_workload(name, **TINY[name])
    assert isinstance(workload, TrainStep)
    assert workload.name == name and workload.build_args == {**TINY[name], "channels_last": False, "dtype": "fp32", "seed": 0}
    assert workload.model.training
    assert workload.items_per_batch == TINY[name]["batch_size"]
    for knob, value in TINY[name].items():
        assert workload.config[knob] == value
    for knob in get_spec(name).knobs:  # every knob resolved, defaults included
        assert knob in workload.config
    assert workload.config["dtype"] == "fp32" and workload.config["seed"] == 0
    losses = [workload.run().loss for _ in range(2)]
    assert all(isinstance(loss, float) and math.isfinite(loss) for loss in losses)
    assert any(p.grad is not None for p in workload.model.parameters())


def test_vision_defaults_follow_the_contract():
    spec = get_spec("resnet50")
    assert spec.defaults["image_size"] == 224 and spec.defaults["num_classes"] == 1000
    assert spec.defaults["batch_size"] == 16
    workload = build_workload("resnet50", batch_size=2, image_size=32, num_classes=7)
    inputs, targets = workload.next_batch()
    assert inputs.shape == (2, 3, 32, 32) and targets.shape == (2,)
    assert workload.forward(inputs).shape == (2, 7)
    assert isinstance(workload.optimizer, torch.optim.SGD)
    group = workload.optimizer.param_groups[0]
    # lr is the rate at batch 256, scaled linearly to the batch of 2.
    assert (group["lr"], group["momentum"], group["weight_decay"]) == (pytest.approx(0.1 * 2 / 256), 0.9, 1e-4)
    assert workload.config["lr"] == 0.1


@pytest.mark.parametrize("num_classes", [91, 264])
def test_retinanet_outputs_loss_and_frozen_layers(num_classes):
    workload = build_workload(
        "retinanet_resnext50_fpn", batch_size=1, image_size=128, num_classes=num_classes
    )
    anchors = anchor_count(128)
    assert workload.config["anchors"] == anchors == 9 * (16**2 + 8**2 + 4**2 + 2**2 + 1)

    inputs, targets = workload.next_batch()
    outputs = workload.forward(inputs)
    assert outputs["cls_logits"].shape == (1, anchors, num_classes)
    assert outputs["bbox_regression"].shape == (1, anchors, 4)
    assert targets["cls_targets"].shape == (1, anchors, num_classes)
    positives = int(targets["positive"].sum())
    assert positives == workload.config["positive_anchors_per_image"] >= 1
    assert positives / anchors < 0.01  # a matcher's sparsity: nearly all background
    assert int(targets["cls_targets"].sum()) == positives  # one-hot rows on positives only

    body = workload.model.backbone.body
    frozen = [p for n, p in body.named_parameters() if n.startswith(("conv1.", "layer1."))]
    assert frozen and all(not p.requires_grad for p in frozen)
    assert all(p.requires_grad for n, p in body.named_parameters() if n.startswith("layer2."))
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in workload.model.modules())
    assert any(isinstance(m, FrozenBatchNorm2d) for m in workload.model.modules())
    optimized = {id(p) for group in workload.optimizer.param_groups for p in group["params"]}
    assert not optimized & {id(p) for p in frozen}

    loss = workload.run().loss
    assert math.isfinite(loss)
    assert all(p.grad is None for p in frozen)
    assert body.layer4[0].conv2.weight.grad is not None


def test_retinanet_default_image_size_is_512_and_loss_is_separate():
    spec = get_spec("retinanet_resnext50_fpn")
    assert spec.defaults["image_size"] == 512 and spec.defaults["num_classes"] == 91
    assert "512" in spec.description
    workload = build_workload("retinanet_resnext50_fpn", batch_size=1, image_size=64)
    assert isinstance(workload.loss_fn, RetinaNetLoss)
    assert not isinstance(workload.model, RetinaNetLoss)
    assert all(not isinstance(m, RetinaNetLoss) for m in workload.model.modules())


def test_retinanet_focal_loss_is_swappable():
    import torchvision

    calls = []

    def recording_focal_loss(logits, targets, alpha, gamma, reduction):
        calls.append((tuple(logits.shape), alpha, gamma, reduction))
        return torchvision.ops.sigmoid_focal_loss(
            logits, targets, alpha=alpha, gamma=gamma, reduction=reduction
        )

    workload = build_workload("retinanet_resnext50_fpn", batch_size=1, image_size=64)
    inputs, targets = workload.next_batch()
    outputs = workload.forward(inputs)
    reference = workload.loss_fn(outputs, targets)
    workload.loss_fn.focal_loss = recording_focal_loss
    swapped = workload.loss_fn(outputs, targets)
    assert calls == [((1, anchor_count(64), 91), 0.25, 2.0, "sum")]
    assert torch.equal(reference, swapped)


def test_retinanet_anchor_count_at_800_matches_the_model():
    assert anchor_count(800) == 9 * (100**2 + 50**2 + 25**2 + 13**2 + 7**2) == 120_087
    # The model itself (on the meta device: shapes only, no memory or arithmetic) agrees,
    # also for sizes that are not multiples of 128.
    with torch.device("meta"):
        model = RetinaNetDense(num_classes=264)
        for size in (800, 100):
            outputs = model(torch.empty(1, 3, size, size))
            assert outputs["cls_logits"].shape == (1, anchor_count(size), 264)


def test_bert_base_full_depth_trains_on_short_sequences():
    workload = build_workload("bert_base", batch_size=2, seq_len=16)
    assert workload.config["layers"] == 12 and workload.config["hidden"] == 768
    assert workload.config["ffn"] == 3072 and workload.config["vocab_size"] == 30522
    assert len(workload.model.encoder.layers) == 12
    assert workload.model.mlm_decoder.weight is workload.model.token_embedding.weight
    assert isinstance(workload.optimizer, torch.optim.AdamW)
    inputs, targets = workload.next_batch()
    assert inputs.shape == targets.shape == (2, 16) and inputs.dtype == torch.int64
    masked = targets != IGNORE_INDEX
    assert masked.sum(dim=1).tolist() == [2, 2]  # round(0.15 x 14 word positions)
    assert math.isfinite(workload.run().loss)


def test_bert_scaled_down_knobs():
    workload = build_workload("bert_base", batch_size=2, seq_len=8, layers=1, hidden=32, heads=2)
    assert len(workload.model.encoder.layers) == 1
    assert workload.forward(workload.next_batch()[0]).shape == (2, 8, 30522)


def test_lstm_targets_are_inputs_shifted_by_one_and_tied_knob():
    workload = build_workload("lstm_lm", batch_size=2, seq_len=8)
    assert workload.config["hidden"] == 650 and workload.config["vocab_size"] == 10000
    inputs, targets = workload.next_batch()
    assert inputs.shape == targets.shape == (2, 8)
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    assert workload.forward(inputs).shape == (2, 8, 10000)
    assert workload.optimizer.param_groups[0]["lr"] == 1.0
    tied = build_workload("lstm_lm", batch_size=2, seq_len=8, hidden=32, vocab_size=100, tied=True)
    assert tied.model.decoder.weight is tied.model.embedding.weight


def test_next_batch_cycles_a_small_pool():
    workload = build_workload("small_cnn", batch_size=2)
    pool = len(workload.batches)
    first = workload.next_batch()
    for _ in range(pool - 1):
        workload.next_batch()
    assert workload.next_batch() is first
    assert workload.config["data_pool_batches"] == pool


@pytest.mark.parametrize(
    ("name", "knobs"),
    [
        ("small_cnn", {"batch_size": 2}),
        ("lstm_lm", {"batch_size": 2, "seq_len": 8, "hidden": 32, "vocab_size": 100}),  # dropout
        ("bert_base", TINY["bert_base"]),
    ],
)
def test_same_seed_same_first_loss_different_seed_different(name, knobs):
    first = build_workload(name, seed=3, **knobs)
    first_loss = first.run().loss
    second = build_workload(name, seed=3, **knobs)
    assert second.run().loss == first_loss
    for a, b in zip(first.batches, second.batches):
        assert torch.equal(a[0], b[0])
    other = build_workload(name, seed=4, **knobs)
    assert other.run().loss != first_loss
    assert not torch.equal(other.batches[0][0], first.batches[0][0])


def test_unknown_workload_lists_the_choices():
    with pytest.raises(WorkloadError) as info:
        build_workload("resnet51")
    message = str(info.value)
    assert "resnet51" in message
    for name in CONTRACT_NAMES:
        assert name in message


@pytest.mark.parametrize(
    ("name", "kwargs", "fragment"),
    [
        ("alexnet", {"image_size": 32}, "image_size must be >= 63"),
        ("bert_base", {"seq_len": 0}, "seq_len must be >= 1"),
        ("bert_base", {"seq_len": 513}, "seq_len must be <= 512"),
        ("lstm_lm", {"seq_len": -1}, "seq_len must be >= 1"),
        ("resnet50", {"dtype": "fp16"}, "dtype must be one of fp32, bf16"),
        ("resnet50", {"seq_len": 16}, "does not take seq_len"),
        ("bert_base", {"image_size": 224}, "does not take image_size"),
        ("lstm_lm", {"num_classes": 10}, "does not take num_classes"),
        ("small_cnn", {"momentum": 0.5}, "does not take momentum"),
        ("small_cnn", {"batch_size": 0}, "batch_size must be >= 1"),
        ("small_cnn", {"batch_size": 2.5}, "batch_size must be an integer"),
        ("small_cnn", {"lr": -0.1}, "lr must be > 0"),
        ("small_cnn", {"seed": -1}, "seed must be a non-negative integer"),
        ("retinanet_resnext50_fpn", {"num_classes": 0}, "num_classes must be >= 1"),
        ("retinanet_resnext50_fpn", {"trainable_layers": 6}, "trainable_layers must be <= 5"),
        ("retinanet_resnext50_fpn", {"positive_fraction": 0.0}, "positive_fraction must be > 0"),
        ("bert_base", {"hidden": 100, "heads": 12}, "must be divisible by heads"),
        ("lstm_lm", {"tied": "yes"}, "tied must be true or false"),
        ("resnet50", {"batch_size": 1, "image_size": 32}, "cannot train on inputs of shape"),
    ],
)
def test_impossible_knobs_raise_workload_error(name, kwargs, fragment):
    with pytest.raises(WorkloadError, match=fragment):
        build_workload(name, **kwargs)


def test_channels_last_converts_model_and_inputs():
    workload = build_workload("small_cnn", batch_size=2, channels_last=True)
    assert workload.config["channels_last"] is True
    conv = workload.model.features[0]
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert not conv.weight.is_contiguous()
    inputs, _ = workload.next_batch()
    assert inputs.is_contiguous(memory_format=torch.channels_last) and not inputs.is_contiguous()
    assert math.isfinite(workload.run().loss)
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)  # still, after a step


def test_channels_last_is_ignored_with_a_note_for_token_models():
    workload = build_workload(
        "lstm_lm", batch_size=2, seq_len=8, hidden=32, vocab_size=100, channels_last=True
    )
    assert workload.config["channels_last"] is False
    assert any("channels_last ignored" in note for note in workload.config["notes"])


def test_bf16_runs_forward_under_autocast_and_keeps_the_loss_fp32():
    workload = build_workload("small_cnn", batch_size=2, dtype="bf16")
    seen = []
    conv = workload.model.features[0]
    conv.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    inputs, targets = workload.next_batch()
    outputs = workload.forward(inputs)
    assert seen == [torch.bfloat16]  # the convolution ran in BF16
    assert outputs.dtype == torch.float32
    loss = workload.loss_fn(outputs, targets)
    assert loss.dtype == torch.float32
    assert math.isfinite(workload.run().loss)
    assert workload.model.classifier.weight.dtype == torch.float32  # master weights stay fp32
    assert any("autocast" in note for note in workload.config["notes"])


def test_bf16_retinanet_loss_is_fp32():
    workload = build_workload("retinanet_resnext50_fpn", batch_size=1, image_size=64, dtype="bf16")
    inputs, targets = workload.next_batch()
    outputs = workload.forward(inputs)
    assert outputs["cls_logits"].dtype == torch.float32
    assert workload.loss_fn(outputs, targets).dtype == torch.float32

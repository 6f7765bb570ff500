"""Activation offloading, checkpointing policies and the memory vs time table (on the CPU)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from profilednn.errors import InputError, ProfileDNNError
from profilednn.memory import offload_activations
from profilednn.memory.activations import SavedTensorCounter
from profilednn.memory.checkpointing import Checkpointed, apply_checkpointing, parse_policy
from profilednn.memory.tradeoff import memory_tradeoff
from profilednn.workloads import build_workload
from profilednn.workloads.digits import digits_mlp


def _grads(name, *, offload=None, policy="none", **knobs):
    wl = build_workload(name, **knobs)
    apply_checkpointing(wl.model, policy)
    x, y = wl.next_batch()
    ctx = offload_activations(model=wl.model, **offload) if offload is not None else None
    if ctx is not None:
        with ctx:
            loss = wl.loss_fn(wl.forward(x), y)
    else:
        loss = wl.loss_fn(wl.forward(x), y)
    loss.backward()
    return [p.grad.clone() for p in wl.model.parameters()], ctx


@pytest.mark.parametrize("channels_last", [False, True])
def test_offload_gives_bit_identical_gradients(channels_last):
    knobs = dict(batch_size=4, image_size=16, channels_last=channels_last)
    plain, _ = _grads("small_cnn", **knobs)
    offloaded, ctx = _grads("small_cnn", offload={"min_bytes": 0}, **knobs)
    assert all(torch.equal(a, b) for a, b in zip(plain, offloaded))
    stats = ctx.stats
    assert stats.offloaded > 10 and stats.offloaded_bytes > 0
    assert stats.deduplicated >= 3  # each ReLU output is saved again by the next max-pool
    assert stats.weights >= 3 and stats.kept == 0


def test_offload_digits_mlp_bit_identical_without_a_model_argument():
    x, y = torch.rand(32, 64), torch.randint(0, 10, (32,))
    grads = []
    for offload in (False, True):
        model = digits_mlp(seed=1)
        if offload:
            with offload_activations(min_bytes=0) as off:  # weights recognised as leaves needing grad
                loss = nn.functional.cross_entropy(model(x), y)
        else:
            loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    # The first Linear needs no weight for backward (its input needs no gradient): 2 kept.
    assert off.stats.weights == 2 and off.stats.offloaded >= 4


def test_size_threshold_keeps_small_tensors():
    _, ctx = _grads("small_cnn", offload={"min_bytes": 1 << 30}, batch_size=2, image_size=16)
    assert ctx.stats.offloaded == 0 and ctx.stats.kept > 0
    _, ctx = _grads("small_cnn", offload={"min_bytes": 4096}, batch_size=2, image_size=16)
    assert ctx.stats.offloaded > 0 and ctx.stats.kept > 0  # BN statistics and targets stay


def test_a_second_backward_through_offloaded_tensors_is_refused():
    model = digits_mlp(seed=0)
    with offload_activations(min_bytes=0):
        loss = model(torch.rand(8, 64)).square().mean()
    loss.backward(retain_graph=True)
    with pytest.raises(ProfileDNNError, match="one backward"):
        loss.backward()


@pytest.mark.parametrize("policy", ["every:2", "every:1", "types:Conv2d,BatchNorm2d,MaxPool2d"])
def test_checkpointing_keeps_gradients_and_saves_less(policy):
    knobs = dict(batch_size=4, image_size=16)
    plain, _ = _grads("small_cnn", **knobs)
    checkpointed, _ = _grads("small_cnn", policy=policy, **knobs)
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(plain, checkpointed))
    saved = {}
    for p in ("none", policy):
        wl = build_workload("small_cnn", **knobs)
        apply_checkpointing(wl.model, p)
        x, y = wl.next_batch()
        with SavedTensorCounter(wl.model) as counter:
            wl.loss_fn(wl.forward(x), y)
        saved[p] = counter.total
    assert saved[policy] < saved["none"]


def test_checkpoint_and_offload_together_are_bit_identical_to_checkpoint_alone():
    knobs = dict(batch_size=4, image_size=16)
    a, _ = _grads("small_cnn", policy="every:2", **knobs)
    b, ctx = _grads("small_cnn", policy="every:2", offload={"min_bytes": 0}, **knobs)
    assert all(torch.equal(x, y) for x, y in zip(a, b)) and ctx.stats.offloaded > 0


def test_every_k_segments_never_start_with_an_inplace_layer():
    wl = build_workload("small_cnn", batch_size=2, image_size=16)
    apply_checkpointing(wl.model, "every:2")
    for segment in wl.model.features:
        assert isinstance(segment, Checkpointed)
        first = segment.inner[0] if isinstance(segment.inner, nn.Sequential) else segment.inner
        assert not getattr(first, "inplace", False)


@pytest.mark.parametrize("bad", ["every:0", "every:x", "types:", "sometimes", "types:NoSuchLayer"])
def test_bad_checkpoint_policies_are_clear_errors(bad):
    with pytest.raises(InputError):
        if bad == "types:NoSuchLayer":
            apply_checkpointing(digits_mlp(), bad)
        else:
            parse_policy(bad)


def test_tradeoff_table_has_the_four_configurations():
    df = memory_tradeoff("small_cnn", batch_size=4, image_size=16, offload_min_bytes=0, steps=1)
    assert df["config"].to_list() == ["none", "offload", "checkpoint", "both"]
    row = {r["config"]: r for r in df.iter_rows(named=True)}
    assert row["offload"]["saved_device_bytes"] == 0 and row["both"]["saved_device_bytes"] == 0
    assert row["offload"]["offloaded_bytes"] == row["none"]["saved_device_bytes"]
    assert row["checkpoint"]["saved_device_bytes"] < row["none"]["saved_device_bytes"]
    assert row["both"]["offloaded_bytes"] == row["checkpoint"]["saved_device_bytes"]
    assert row["checkpoint"]["peak_bytes"] < row["none"]["peak_bytes"]
    # Same weights, data and numerics: the observed step's loss is the same everywhere.
    assert df["loss"].n_unique() == 1
    assert row["none"]["peak_vs_none"] == pytest.approx(1.0) and (df["step_ms"] > 0).all()


def test_max_bytes_caps_what_is_offloaded_earliest_first():
    plain, _ = _grads("small_cnn", batch_size=4, image_size=16)
    capped, ctx = _grads("small_cnn", offload={"min_bytes": 0, "max_bytes": 600_000}, batch_size=4, image_size=16)
    assert all(torch.equal(a, b) for a, b in zip(plain, capped))
    assert 0 < ctx.stats.offloaded_bytes <= 600_000 and ctx.stats.kept > 0

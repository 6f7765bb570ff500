"""Memory footprint: saved activations predicted vs measured, optimizer state, peak, budget."""

from __future__ import annotations

import polars as pl
import pytest
import torch
from torch import nn

from profilednn.errors import InputError
from profilednn.memory.activations import SavedTensorCounter, predict_saved_activations
from profilednn.memory.budget import fit_batch_to_budget
from profilednn.memory.footprint import measure_footprint, optimizer_state_bytes, predict_optimizer_state_bytes
from profilednn.memory.training import build_on_device
from profilednn.memory.units import format_bytes, parse_bytes
from profilednn.tables import MEMORY_SUMMARY
from profilednn.workloads import build_workload
from profilednn.workloads.digits import digits_mlp


def _measured(model, forward, loss_fn, x, y):
    with SavedTensorCounter(model) as counter:
        loss = loss_fn(forward(x), y)
    loss.backward()
    return counter


@pytest.mark.parametrize("channels_last", [False, True])
def test_small_cnn_saved_activations_predicted_within_10_percent(channels_last):
    wl = build_workload("small_cnn", batch_size=4, image_size=16, channels_last=channels_last)
    x, y = wl.next_batch()
    predicted = predict_saved_activations(wl.model, x, wl.loss_fn, y, forward=wl.forward)
    measured = _measured(wl.model, wl.forward, wl.loss_fn, x, y)
    assert measured.total > 0 and measured.storages > 10
    assert abs(predicted.total / measured.total - 1) <= 0.10
    # Layer by layer too: a conv keeps its input, batch norm its input and two statistics,
    # a max-pool its int64 indices (its input is the ReLU output already counted).
    assert predicted.by_module["features.0"] == measured.by_module["features.0"] == x.numel() * 4
    assert predicted.by_module["features.1"] == measured.by_module["features.1"] == 4 * 32 * 16 * 16 * 4 + 2 * 32 * 4
    assert predicted.by_module["features.3"] == measured.by_module["features.3"] == 4 * 32 * 8 * 8 * 8
    assert predicted.assumed == []


def test_digits_mlp_saved_activations_predicted_within_10_percent():
    model = digits_mlp(seed=0)
    x, y = torch.rand(16, 64), torch.randint(0, 10, (16,))
    loss_fn = nn.CrossEntropyLoss()
    predicted = predict_saved_activations(model, x, loss_fn, y)
    measured = _measured(model, model, loss_fn, x, y)
    assert abs(predicted.total / measured.total - 1) <= 0.10
    # ReLU keeps its output; the next Linear saves that same tensor, counted once.
    assert measured.by_module.get("2", 0) == 0 and measured.by_module["1"] == 16 * 128 * 4


def test_weights_and_buffers_are_not_counted_as_activations():
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8))
    x = torch.randn(4, 8)
    measured = _measured(model, model, lambda out, _: out.sum(), x, None)
    # Linear: its input only; BatchNorm1d: its input and save_mean/save_invstd.
    assert measured.total == 4 * 8 * 4 + 4 * 8 * 4 + 2 * 8 * 4


@pytest.mark.parametrize("make, per_param", [
    (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), 1),
    (lambda p: torch.optim.SGD(p, lr=0.1), 0),
    (lambda p: torch.optim.Adam(p, lr=1e-3), 2),
])
def test_optimizer_state_predicted_from_type_matches_its_state_after_a_step(make, per_param):
    model = digits_mlp(seed=0)
    opt = make(model.parameters())
    predicted = sum(predict_optimizer_state_bytes(opt).values())
    params = sum(p.numel() * 4 for p in model.parameters())
    assert predicted == per_param * params
    model(torch.rand(4, 64)).sum().backward()
    opt.step()
    measured = sum(optimizer_state_bytes(opt).values())
    # Adam also keeps a scalar step per parameter: a few bytes on top.
    assert predicted <= measured <= predicted + 64 * len(list(model.parameters()))


def test_measure_footprint_tables_and_peak_are_consistent():
    fp = measure_footprint(build_on_device("small_cnn", batch_size=4, image_size=16))
    s = fp.summary
    assert s["saved_predicted_bytes"] == s["saved_measured_bytes"] > 0
    assert s["grad_bytes"] == s["params_bytes"] == s["optimizer_state_bytes"]  # SGD with momentum
    # The peak holds at least the weights, their state and the saved activations.
    floor = s["params_bytes"] + s["optimizer_state_bytes"] + s["saved_measured_bytes"]
    assert s["measured_peak_bytes"] >= floor
    assert 0.5 <= s["predicted_peak_bytes"] / s["measured_peak_bytes"] <= 2.0
    layers = fp.layers
    assert int(layers["saved_measured_bytes"].sum()) == s["saved_measured_bytes"]
    assert int(layers["params_bytes"].sum()) == s["params_bytes"]
    conv = layers.filter(layers["module"] == "features.0").row(0, named=True)
    assert conv["module_type"] == "Conv2d" and conv["workspace_bytes"] > 0
    assert fp.summary_table()["quantity"].to_list()[-1] == "peak"
    assert fp.summary_table().schema == pl.Schema(MEMORY_SUMMARY.schema)


def test_budget_batch_is_predicted_then_confirmed_under_the_budget():
    budget = parse_bytes("12MiB")
    result = fit_batch_to_budget("small_cnn", budget, image_size=16)
    assert result.predicted_batch >= 1 and result.confirmed_batch is not None
    confirmed = result.attempts.filter((result.attempts["stage"] == "confirm") & result.attempts["fits"])
    assert confirmed["batch_size"].max() == result.confirmed_batch
    assert (confirmed["measured_peak_bytes"] <= budget).all()
    # A batch measured over the budget, if any was tried, is larger than the answer.
    over = result.attempts.filter((result.attempts["stage"] == "confirm") & ~result.attempts["fits"])
    assert all(b > result.confirmed_batch for b in over["batch_size"].to_list())


def test_budget_too_small_for_the_weights_is_a_clear_error():
    with pytest.raises(InputError, match="does not fit"):
        fit_batch_to_budget("small_cnn", parse_bytes("64KiB"), image_size=16, confirm=False)


def test_byte_sizes_parse_and_format():
    assert parse_bytes("8GiB") == 8 * 2**30
    assert parse_bytes("2GB") == 2 * 10**9
    assert parse_bytes("1.5m") == int(1.5 * 2**20)
    assert parse_bytes("0", allow_zero=True) == 0
    for bad in ("lots", "-1GiB", "0", "5 parsecs"):
        with pytest.raises(InputError):
            parse_bytes(bad)
    assert format_bytes(3 * 2**20) == "3.0 MiB" and format_bytes(None) == "-"

"""The numerics gate for reduced precision (BF16 judged by how it trains), per-dtype FLOPs
and MFU in ``optimize``, and dtype_policy on CPUs with and without native BF16 (injected).

BF16 is emulated (slow) on a CPU without it, so the models here are tiny.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from profilednn.optimization import RECIPES, Context, TrainStep, load_recipes
from profilednn.optimization.abtest import Timing
from profilednn.optimization.api import OptimizeReport, Settings, optimize_setup, step_flops
from profilednn.optimization.precision import NOT_NATIVE
from profilednn.optimization.flops import step_flops_by_dtype
from profilednn.optimization.precision import DtypePolicy
from profilednn.optimization.precision_gate import (
    GateSettings,
    calibrate,
    digits_task,
    judge_trajectory,
    precision_gate,
)
from profilednn.optimization.numerics import record_trajectory
from profilednn.optimization.recipes import Tolerance
from profilednn.topology import cpu_topology

load_recipes()
GATE = GateSettings(steps=6, digits_epochs=4)


def cnn_setup() -> TrainStep:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, 3))
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 3, 8, 8, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(3)]
    return TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.05), nn.CrossEntropyLoss(), batches)


def bf16(setup: TrainStep) -> TrainStep:
    out = setup.clone()
    out.autocast_dtype = torch.bfloat16
    return out


class SlowLearner(DtypePolicy):
    """BF16 plus a learning rate 1000x smaller: it does not train as stock does."""

    name = "slow_learner"

    def apply(self, setup, ctx):
        for group in setup.optimizer.param_groups:
            group["lr"] *= 1e-3
        return super().apply(setup, ctx)


class StrictBF16(DtypePolicy):
    """dtype_policy with a loss bound no BF16 trajectory meets (with a tiny noise factor):
    the digits task decides."""

    name = "strict_bf16"
    tolerance = Tolerance(loss_rtol=1e-12, grad_rtol=math.inf)


# ------------------------------------------------------------------ FLOPs and MFU by dtype
def test_step_flops_by_dtype_follow_the_autocast_policy() -> None:
    stock = cnn_setup()
    fp32 = step_flops_by_dtype(stock)
    assert set(fp32) == {"fp32"} and fp32["fp32"] == pytest.approx(step_flops(stock))
    assert step_flops_by_dtype(bf16(stock)) == {"bf16": pytest.approx(fp32["fp32"])}


def test_optimize_mfu_holds_bf16_flops_against_the_bf16_peak() -> None:
    report = OptimizeReport("w", [], ["dtype_policy"], {}, baseline=Timing((100.0,)), final=Timing((50.0,)),
                            flops_per_step=4e9, gemm_peak_gflops=200.0, flops_by_dtype={"fp32": 4e9},
                            flops_by_dtype_final={"bf16": 4e9}, peak_gflops_by_dtype={"fp32": 200.0, "bf16": 440.0})
    assert report.mfu_baseline == pytest.approx(4e9 / 200e9 / 0.1)
    assert report.mfu_final == pytest.approx(4e9 / 440e9 / 0.05)  # not 4e9 / 200e9 / 0.05
    d = report.to_dict()
    assert d["peak_gflops_by_dtype"] == {"fp32": 200.0, "bf16": 440.0} and d["flops_by_dtype_final"] == {"bf16": 4e9}
    emulated = OptimizeReport("w", [], [], {}, baseline=Timing((100.0,)), final=Timing((50.0,)),
                              flops_by_dtype={"bf16": 4e9}, peak_gflops_by_dtype={"fp32": 200.0})
    assert emulated.mfu_final == pytest.approx(4e9 / 200e9 / 0.05)  # no bf16 peak: fp32's


# ------------------------------------------------------------------ the gate
def test_bf16_that_trains_as_stock_passes_on_its_trajectory(native_bf16_cpu) -> None:
    stock = cnn_setup()
    calib = calibrate(stock, "bf16", GATE)
    assert len(calib.reference.losses) == GATE.steps and calib.noise.loss_max_rel_diff > 0
    ctx = Context(cpu_topology())
    result = precision_gate(RECIPES["dtype_policy"], calib, record_trajectory(bf16(stock), GATE.steps, 0), ctx, GATE)
    assert result.passed, result.detail
    assert "trains as stock" in result.detail and "noise floor" in result.detail
    assert "gradients rel L2" in result.detail and "not decisive" in result.detail


@pytest.mark.zoo
def test_a_precision_recipe_that_does_not_train_is_rejected_with_figures(native_bf16_cpu) -> None:
    stock = cnn_setup()
    calib = calibrate(stock, "bf16", GATE)
    ctx = Context(cpu_topology())
    slow = stock.clone()
    SlowLearner().apply(slow, ctx)
    trajectory = record_trajectory(slow, GATE.steps, 0)
    first, conclusive = judge_trajectory(calib, trajectory, SlowLearner.tolerance, GATE)
    assert not first.passed and not conclusive  # finite but outside the bound: ask the digits
    result = precision_gate(SlowLearner(), calib, trajectory, ctx, GATE)
    assert not result.passed
    assert "does not train the digits as well as stock" in result.detail and "test accuracy stock" in result.detail


def test_a_diverging_loss_fails_at_once() -> None:
    stock = cnn_setup()
    calib = calibrate(stock, "bf16", GATE)
    bad = record_trajectory(stock.clone(), GATE.steps, 0)
    bad.losses[-1] = float("nan")
    result, conclusive = judge_trajectory(calib, bad, Tolerance(0.05, math.inf), GATE)
    assert conclusive and not result.passed and "not finite" in result.detail


@pytest.mark.zoo
def test_an_inconclusive_trajectory_is_settled_by_the_digits_task(native_bf16_cpu) -> None:
    stock = cnn_setup()
    calib = calibrate(stock, "bf16", GATE)
    ctx = Context(cpu_topology())
    strict = GateSettings(steps=GATE.steps, digits_epochs=GATE.digits_epochs, factor=1e-6)
    trajectory = record_trajectory(bf16(stock), GATE.steps, 0)
    assert not judge_trajectory(calib, trajectory, StrictBF16.tolerance, strict)[1]  # not conclusive
    result = precision_gate(StrictBF16(), calib, trajectory, ctx, strict)
    assert result.passed, result.detail
    assert result.detail.startswith("trains the digits as well as stock: digits task (4 epochs)")
    outcome = digits_task(StrictBF16(), ctx, GATE)
    assert outcome.passed and outcome.stock_accuracy >= GATE.digits_target
    assert outcome.recipe_accuracy >= outcome.stock_accuracy - GATE.digits_margin


# ------------------------------------------------------------------ optimize, both CPUs
@pytest.mark.zoo
@pytest.mark.cpu_facing
def test_dtype_policy_in_optimize_on_any_cpu(any_cpu) -> None:
    settings = Settings(rounds=2, warmup=0, numerics_steps=2, precision_steps=4, digits_epochs=2,
                        measure_flops=False, calibrate_noise=False)
    result = optimize_setup(cnn_setup(), ["dtype_policy"], settings)
    (row,) = result.report.recipes
    if "bf16" not in any_cpu.faster_dtypes():  # the native branch injects AMX: BF16 pays there
        assert not row.applies and NOT_NATIVE in row.reason
        return
    assert row.applies and row.numerics == "pass", row.numerics_detail
    assert "bf16 gate" in row.tolerance and "bf16 loss trajectory over 4 steps" in row.numerics_detail
    # Speed decides after the gate passed: accepted when its interval clears the bar, else rejected
    # or inconclusive with the measured ratio and its interval (never for numerics: on a CPU that
    # emulates BF16 any of them can happen).
    if row.accepted:
        assert row.decision.startswith("accepted")
    else:
        assert row.outcome in ("rejected", "inconclusive") and row.decision.startswith(row.outcome)
        assert "numerics pass" in row.decision and row.speedup_ci is not None, row.decision

"""The numerics gate asks each recipe the right question: against the arm it would replace,
at that arm's precision. A recipe that changes no arithmetic (threads, allocator, DataLoader
workers) is never failed by BF16's gradient chaos; one that really changes the training is
still rejected after BF16. BF16 is injected (emulated where the CPU lacks it): tiny models."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from profilednn.optimization import RECIPES, Context, TrainStep, load_recipes
from profilednn.optimization.api import Settings, optimize_setup
from profilednn.optimization.gate import Arm, environment_gate, judge
from profilednn.optimization.numerics import Trajectory
from profilednn.optimization.precision import DtypePolicy
from profilednn.optimization.precision_gate import Calibration, GateSettings
from profilednn.optimization.process import is_glibc
from profilednn.optimization.recipe_contract import Recipe
from profilednn.optimization.numerics import NumericsResult
from profilednn.optimization.recipes import Tolerance
from profilednn.topology import cpu_topology
from test_precision_gate import cnn_setup

load_recipes()
FAST = dict(numerics_steps=2, rounds=1, warmup=0, min_speedup=1e-9, child_runs=1, child_steps=1,
            final_ab=False, measure_flops=False, precision_steps=4, digits_epochs=2)
needs_glibc = pytest.mark.skipif(not is_glibc(), reason="the allocator recipe's fallback needs glibc")


class BF16Later(DtypePolicy):
    """dtype_policy under another name, so that it runs after the named built-ins."""

    name = "bf16_later"


class LearningRateTimes30(Recipe):
    """Changes the training for real: every learning rate 30x."""

    name = "lr_times_30"
    family = "test"

    def check(self, setup, ctx):
        return None

    def apply(self, setup, ctx):
        for group in setup.optimizer.param_groups:
            group["lr"] *= 30.0
        return "lr x 30"


def _by_name(report) -> dict:
    return {r.recipe: r for r in report.recipes}


# ------------------------------------------------------------------ the environment gate
def _traj(losses: list[float], grad: float) -> Trajectory:
    return Trajectory(losses, {"w": torch.full((4,), grad)}, 1.0)


def test_environment_gate_looks_at_losses_never_at_gradients() -> None:
    arm = _traj([2.0, 1.9, 1.8], 1.0)
    same_losses_chaotic_grads = _traj([2.0, 1.9, 1.8], -7.0)  # rel L2 8: BF16-style chaos
    verdict = environment_gate(arm, same_losses_chaotic_grads, 1e-3, 5.0, "bf16")
    assert verdict.numerics.passed and "bit-identical" in verdict.numerics.detail
    assert "changes no arithmetic" in verdict.question and "bf16" in verdict.question
    within = environment_gate(arm, _traj([2.0, 1.9, 1.8 * (1 + 2e-3)], 1.0), 1e-3, 5.0, "bf16")
    assert within.numerics.passed and "within the arm's noise" in within.numerics.detail
    beyond = environment_gate(arm, _traj([2.0, 1.9, 1.8 * 1.05], 1.0), 1e-3, 5.0, "bf16")
    assert not beyond.numerics.passed and "beyond the arm's noise" in beyond.numerics.detail
    assert not environment_gate(arm, _traj([2.0, math.nan, 1.8], 1.0), 1e-3, 5.0, None).numerics.passed


@pytest.mark.parametrize("name", ["threads", "allocator", "dataloader_workers"])
def test_recipes_that_change_no_arithmetic_are_judged_by_the_environment_gate(name) -> None:
    recipe = RECIPES[name]
    assert recipe.changes_arithmetic is False
    noise = NumericsResult("pass", 3, 1e-3, 0.5, None, 0.0, "", Tolerance())
    calib = Calibration("bf16", _traj([2.0, 1.9, 1.8], 1.0), noise)
    for precision in (None, "bf16"):
        verdict = judge(recipe, Arm(_traj([2.0, 1.9, 1.8], 1.0), precision), _traj([2.0, 1.9, 1.8], 5.0),
                        ctx=Context(cpu_topology()), gate=GateSettings(), rounding=noise,
                        calibration=lambda p: calib)
        assert verdict.numerics.passed, (name, precision, verdict.numerics.detail)


# ------------------------------------------------------------------ whole optimize runs
@needs_glibc
def test_env_recipe_after_bf16_is_accepted_on_its_losses(native_bf16_cpu) -> None:
    report = optimize_setup(cnn_setup(), ["dtype_policy", "allocator"], Settings(**FAST)).report
    rows = _by_name(report)
    assert rows["dtype_policy"].accepted, rows["dtype_policy"].decision
    alloc = rows["allocator"]
    assert alloc.numerics == "pass" and alloc.accepted, alloc.decision
    assert "changes no arithmetic" in alloc.tolerance and "bf16" in alloc.tolerance
    assert "numerics fail" not in alloc.decision


@needs_glibc
def test_env_recipe_before_bf16_then_bf16_by_the_precision_gate(native_bf16_cpu) -> None:
    report = optimize_setup(cnn_setup(), ["allocator", BF16Later()], Settings(**FAST)).report
    rows = _by_name(report)
    assert [r.recipe for r in report.recipes] == ["allocator", "bf16_later"]
    assert rows["allocator"].accepted and "fp32" in rows["allocator"].tolerance
    assert rows["bf16_later"].accepted and rows["bf16_later"].tolerance.startswith("bf16 gate")


def test_a_recipe_that_breaks_numerics_after_bf16_is_still_rejected(native_bf16_cpu) -> None:
    report = optimize_setup(cnn_setup(), ["dtype_policy", LearningRateTimes30()], Settings(**FAST)).report
    rows = _by_name(report)
    assert rows["dtype_policy"].accepted
    broken = rows["lr_times_30"]
    assert not broken.accepted and broken.decision.startswith("rejected: numerics fail")
    assert "at the arm's precision (bf16)" in broken.tolerance
    assert broken.loss_max_rel_diff > 0.01


def test_a_later_fp32_recipe_is_judged_against_the_arm_not_stock(no_bf16_cpu) -> None:
    """channels_last after fused_optimizer: compared with the fp32 arm that has the fused
    optimizer, within the fp32 tolerance; a real change is still rejected."""
    report = optimize_setup(cnn_setup(), ["fused_optimizer", "channels_last", LearningRateTimes30()],
                            Settings(**FAST)).report
    rows = _by_name(report)
    assert rows["channels_last"].numerics == "pass"
    assert "relative L2" in rows["channels_last"].tolerance
    assert rows["lr_times_30"].decision.startswith("rejected: numerics fail")


def test_an_accepted_compile_keeps_the_flop_count_and_mfu(no_bf16_cpu) -> None:
    """A compiled setup cannot be cloned: the optimized FLOPs are counted before compiling
    (a compiler changes none), not on the compiled model (that raised before)."""
    pytest.importorskip("torch._dynamo")
    from profilednn.optimization.compile import compiler_missing

    if compiler_missing():
        pytest.skip(compiler_missing())
    settings = Settings(**{**FAST, "measure_flops": True, "headroom": False})
    report = optimize_setup(cnn_setup(), ["torch_compile"], settings).report
    assert report.accepted == ["torch_compile"], _by_name(report)["torch_compile"].decision
    assert report.flops_by_dtype_final == report.flops_by_dtype and report.flops_by_dtype["fp32"] > 0


class Sleep(nn.Module):
    """An identity that sleeps: a stock step that BF16Fast makes fast."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def forward(self, x):
        import time

        time.sleep(self.seconds)
        return x


STOCK_SLEEP_S = 0.2


def sleepy_setup() -> TrainStep:
    setup = cnn_setup()
    # 200 ms of sleep against a ~1 ms model: the arms' ratios stay far from 1 when a loaded
    # machine (or BF16 emulated on a CPU without it) stretches the model's own work
    setup.model = nn.Sequential(Sleep(STOCK_SLEEP_S), *setup.model)
    setup.optimizer = torch.optim.SGD(setup.model.parameters(), lr=0.05)
    return setup


class BF16Fast(BF16Later):
    """BF16 autocast that also takes most of the stock step's sleep away: accepted at any min_speedup."""

    name = "bf16_fast"

    def apply(self, setup, ctx):
        # 10 ms left, not 0: both arms of the second pass then last >= 10 ms, so their
        # ratio stays near 1 on a loaded machine instead of comparing two ~1 ms steps.
        for m in setup.model.modules():
            if isinstance(m, Sleep):
                m.seconds = 0.01
        return super().apply(setup, ctx)


class SlowUntilBF16(Recipe):
    """Changes no arithmetic, but sleeps in fp32 steps: rejected as slower on the first pass,
    no slower than its arm once the arm runs BF16 autocast."""

    name = "slow_until_bf16"
    family = "test"

    def check(self, setup, ctx):
        return None

    def apply(self, setup, ctx):
        import time

        inner = setup.loss_fn

        def loss_fn(outputs, targets):
            if setup.autocast_dtype is None:
                time.sleep(STOCK_SLEEP_S)
            return inner(outputs, targets)

        setup.loss_fn = loss_fn
        return "sleeps 200 ms a step unless under autocast"


def test_a_recipe_rejected_for_speed_is_tried_again_once_bf16_changed_the_arm(native_bf16_cpu, one_thread) -> None:
    report = optimize_setup(sleepy_setup(), [SlowUntilBF16(), BF16Fast()],
                            Settings(**{**FAST, "rounds": 5, "warmup": 1, "min_speedup": 1.0})).report
    rows = _by_name(report)
    assert rows["bf16_fast"].accepted, rows["bf16_fast"].decision
    second = rows["slow_until_bf16"]
    assert "second pass, after bf16_fast" in second.decision and "first pass 0." in second.decision
    assert second.speedup > 0.5, (second.decision, rows["bf16_fast"].decision)  # measured against the BF16 arm: no longer 2x slower
    assert [r.recipe for r in report.recipes] == ["slow_until_bf16", "bf16_fast"]  # one row per recipe


def test_no_second_pass_when_nothing_changed_the_arm(no_bf16_cpu, one_thread) -> None:
    # the stock arm sleeps too: a sleep-dominated step's ratio (about 0.5) holds on a busy
    # machine, where a 1 ms step's A-vs-A rounds can stray 30x (2 OpenMP threads beside
    # another process) and leave even 3 lost rounds undecided
    report = optimize_setup(sleepy_setup(), [SlowUntilBF16()], Settings(**{**FAST, "rounds": 3, "min_speedup": 1.0})).report
    (row,) = report.recipes
    assert not row.accepted and row.decision.startswith("rejected: slower") and "second pass" not in row.decision

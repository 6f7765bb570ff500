"""The random-stream gate (``optimization/stream_gate.py``): a recipe that draws dropout's
masks from another generator is judged with dropout on. A correct fused dropout passes; one
that forgets the 1/(1-p) scale, or whose backward uses another mask, is rejected, though
with dropout off (the usual gates) both compute the identity and would pass."""

from __future__ import annotations

import torch
from torch import nn

from profilednn.kernels.dropout import FusedDropout, apply_mask, draw_seed, fused_dropout, native_available
from profilednn.optimization import RECIPES, Context, TrainStep, load_recipes
from profilednn.optimization.api import Settings, optimize_setup
from profilednn.optimization.gate import Arm, judge
from profilednn.optimization.numerics import record_trajectory
from profilednn.optimization.precision_gate import GateSettings
from profilednn.optimization.recipe_contract import FP32_TOLERANCE
from profilednn.optimization.stream_gate import FreshSetups, dropout_sites, stream_gate
from profilednn.topology import cpu_topology
import pytest

pytestmark = pytest.mark.skipif(not native_available(), reason="no C compiler: the fused kernel cannot be built")
load_recipes()
FAST = dict(numerics_steps=2, rounds=1, warmup=0, min_speedup=1e-9, child_runs=1, child_steps=1,
            final_ab=False, measure_flops=False, precision_steps=4, digits_epochs=2, headroom=False)


def mlp_setup() -> TrainStep:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Dropout(0.5), nn.Linear(128, 128), nn.ReLU(),
                          nn.Dropout(0.3), nn.Linear(128, 4))
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(64, 16, generator=g), torch.randint(0, 4, (64,), generator=g)) for _ in range(2)]
    return TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.05), nn.CrossEntropyLoss(), batches)


class NoScaleDropout(FusedDropout):
    """Broken: keeps 1 - p but forgets to scale what it keeps by 1/(1-p)."""

    def forward(self, x):
        return fused_dropout(x, self.p, self.training) * ((1.0 - self.p) if self.training else 1.0)


class _OtherMaskBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p):
        seed = int(draw_seed())
        ctx.seed, ctx.p = seed, p
        return apply_mask(x, p, seed)

    @staticmethod
    def backward(ctx, g):
        return apply_mask(g, ctx.p, ctx.seed + 1), None


class OtherMaskDropout(FusedDropout):
    """Broken: its backward draws another mask than its forward."""

    def forward(self, x):
        return _OtherMaskBackward.apply(x, self.p) if self.training and self.p > 0 else x


def swap(model: nn.Module, cls: type[FusedDropout]) -> None:
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Dropout:
                setattr(parent, name, cls.from_dropout(child))


def swapped(setup: TrainStep, cls: type[FusedDropout]) -> TrainStep:
    out = setup.clone()
    swap(out.model, cls)
    return out


def _gate(cls: type[FusedDropout]):
    base = mlp_setup()
    return stream_gate(FreshSetups(base.clone, lambda: swapped(base, cls)), 3, FP32_TOLERANCE, GateSettings())


def test_dropout_off_cannot_tell_a_broken_dropout_from_a_right_one():
    base = mlp_setup()
    ref = record_trajectory(base.clone(), 3, 0)
    assert record_trajectory(swapped(base, NoScaleDropout), 3, 0).losses == ref.losses
    assert record_trajectory(swapped(base, FusedDropout), 3, 0).losses == ref.losses


def test_a_correct_fused_dropout_passes():
    result = _gate(FusedDropout)
    assert result.passed, result.detail
    assert "2 dropout sites checked" in result.detail


def test_a_dropout_without_its_scale_is_rejected():
    result = _gate(NoScaleDropout)
    assert not result.passed
    assert "gain" in result.detail and "1/(1-p)" in result.detail


def test_a_backward_with_another_mask_is_rejected():
    result = _gate(OtherMaskDropout)
    assert not result.passed
    assert "backward does not use the forward's mask" in result.detail


def test_sites_are_stock_dropouts_too():
    sites = dropout_sites(mlp_setup(), seed=0)  # stock nn.Dropout is a dropout by the same test
    assert [s.name for s in sites] == ["2", "5"]
    assert all(not s.problems(6.0) for s in sites), [s.problems(6.0) for s in sites]


def test_judge_fails_a_random_stream_recipe_it_cannot_run_with_dropout_on():
    base = mlp_setup()
    ref = record_trajectory(base.clone(), 2, 0)
    verdict = judge(RECIPES["fused_dropout"], Arm(ref), ref, ctx=Context(cpu_topology()), gate=GateSettings(),
                    rounding=None, calibration=lambda p: None)
    assert not verdict.numerics.passed and "no setups" in verdict.numerics.detail
    assert "random stream" in verdict.question


class BrokenFusedDropout(type(RECIPES["fused_dropout"])):
    name = "broken_fused_dropout"

    def apply(self, setup, ctx):
        swap(setup.model, NoScaleDropout)
        return "nn.Dropout -> NoScaleDropout"


def test_optimize_accepts_the_fused_dropout_and_rejects_a_broken_one():
    report = optimize_setup(mlp_setup(), ["fused_dropout", BrokenFusedDropout()], Settings(**FAST)).report
    rows = {r.recipe: r for r in report.recipes}
    good, after = rows["fused_dropout"], rows["broken_fused_dropout"]
    assert good.numerics == "pass" and good.accepted, good.decision
    assert "random stream" in good.tolerance and "random stream" in good.numerics_detail
    assert not after.applies and "no dropout with p > 0" in after.reason  # nothing stock left to replace
    bad = optimize_setup(mlp_setup(), [BrokenFusedDropout()], Settings(**FAST)).report.recipes[0]
    assert bad.numerics == "fail" and bad.decision.startswith("rejected: numerics fail"), bad.decision
    assert "gain" in bad.numerics_detail

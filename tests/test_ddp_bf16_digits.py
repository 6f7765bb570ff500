"""The precision gate's digits task for ``ddp_bf16_allreduce``: DDP's step simulated in one
process (``ddp_shards``) gives every rank's gradients of a real 2-rank gloo job, with the
BF16 hook and without; the digits train as well under BF16 compression and a broken
reduction fails; an inconclusive trajectory of the recipe goes to the digits task."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from profilednn.optimization.ddp_bf16_allreduce import DdpBf16Allreduce, bf16_allreduce_hook, bf16_compressed_average
from profilednn.optimization.ddp_shards import ShardedStep, fp32_average
from profilednn.optimization.gate import Arm, judge
from profilednn.optimization.numerics import NumericsResult, Trajectory
from profilednn.optimization.precision_gate import Calibration, GateSettings, digits_task, judge_trajectory
from profilednn.optimization.recipes import RECIPES, Context, Tolerance, load_recipes
from profilednn.optimization.script.runner import ArmOutput
from profilednn.optimization.script.search import ScriptSearch
from profilednn.optimization.settings import Settings
from profilednn.recipe_catalogue import DDP_BF16_ALLREDUCE, DTYPE_POLICY, FUSED_OPTIMIZER
from profilednn.topology import cpu_topology
from profilednn.train_step import TrainStep

load_recipes()
RANKS = 2
GATE = GateSettings(steps=6, digits_epochs=4, ranks=RANKS)


def small_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 48), nn.ReLU(), nn.Linear(48, 5))


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(12, 16, generator=g) * 3, torch.randint(0, 5, (12,), generator=g)


def _rank(rank: int, store: str, out: str) -> None:
    """One rank of the gloo job: its shard's gradients reduced by DDP without a hook and with the BF16 hook."""
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=RANKS)
    try:
        x, y = batch()
        held = {}
        for name, hook in (("fp32", None), ("bf16", bf16_allreduce_hook)):
            model = DistributedDataParallel(small_model())
            if hook is not None:
                model.register_comm_hook(None, hook)
            shard = slice(rank * len(y) // RANKS, (rank + 1) * len(y) // RANKS)
            nn.functional.cross_entropy(model(x[shard]), y[shard]).backward()
            held[name] = [p.grad.detach().clone() for p in model.parameters()]
        torch.save(held, out.format(rank=rank))
    finally:
        dist.destroy_process_group()


def _simulated(reduce) -> list[torch.Tensor]:  # type: ignore[no-untyped-def]
    model = small_model()
    setup = TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss())
    per_rank = ShardedStep(RANKS, reduce).shard_grads(setup, *batch())
    assert per_rank is not None
    return [reduce([grads[i] for grads in per_rank]) for i in range(len(per_rank[0]))]


def test_the_simulated_reduction_is_a_real_gloo_allreduce_bit_for_bit(tmp_path: Path) -> None:
    out = str(tmp_path / "held{rank}.pt")
    mp.spawn(_rank, args=(str(tmp_path / "store"), out), nprocs=RANKS, join=True)
    held = [torch.load(out.format(rank=r)) for r in range(RANKS)]
    for name, reduce in (("fp32", fp32_average), ("bf16", bf16_compressed_average)):
        simulated = _simulated(reduce)
        for rank in held:
            assert len(rank[name]) == len(simulated)
            for real, mine in zip(rank[name], simulated):
                assert real.dtype == mine.dtype == torch.float32
                assert torch.equal(real, mine), (name, (real - mine).abs().max())
    # the hook did round: BF16's reduction is not the fp32 average
    assert any(not torch.equal(a, b) for a, b in zip(held[0]["fp32"], held[0]["bf16"]))


@pytest.mark.zoo
def test_bf16_compression_trains_the_digits_as_stock() -> None:
    outcome = digits_task(RECIPES[DDP_BF16_ALLREDUCE], Context(cpu_topology()), GATE)
    assert outcome.applied and outcome.passed, outcome.describe()
    assert outcome.stock_accuracy >= GATE.digits_target
    assert outcome.recipe_accuracy >= outcome.stock_accuracy - GATE.digits_margin
    text = outcome.describe()
    assert f"split over {RANKS} simulated ranks" in text and "bf16_compress_hook" in text
    assert f"test accuracy stock {outcome.stock_accuracy:.3f}, with the recipe {outcome.recipe_accuracy:.3f}" in text


class ZeroedAllreduce(DdpBf16Allreduce):
    """A broken hook: every gradient reduced to zero."""

    reduction = staticmethod(lambda grads: torch.zeros_like(grads[0]))


class NegatedAllreduce(DdpBf16Allreduce):
    """A broken hook: the BF16 average with its sign flipped (scaled by -1). A positive scale
    alone would pass: the digits task trains with Adam, which is invariant to it."""

    reduction = staticmethod(lambda grads: -bf16_compressed_average(grads))


@pytest.mark.zoo
@pytest.mark.parametrize("broken", [ZeroedAllreduce, NegatedAllreduce])
def test_a_broken_reduction_fails_the_digits_task(broken: type[DdpBf16Allreduce]) -> None:
    outcome = digits_task(broken(), Context(cpu_topology()), GATE)
    assert outcome.applied and not outcome.passed, outcome.describe()
    assert outcome.stock_accuracy >= GATE.digits_target


def test_the_digits_task_needs_two_ranks_at_least() -> None:
    arms = RECIPES[DDP_BF16_ALLREDUCE].digits_arms(Context(cpu_topology()), 1)
    assert arms is not None and "split over 2 simulated ranks" in arms.how
    with pytest.raises(ValueError, match="at least 2 ranks"):
        ShardedStep(1, fp32_average)


def test_the_gate_gets_the_jobs_ranks() -> None:
    assert Settings(nproc_per_node=2, nnodes=2).gate().ranks == 4
    assert Settings().gate().ranks == 1
    search = ScriptSearch(["python", "train.py"], Settings.for_script(nproc_per_node=3), Context(cpu_topology()),
                          say=lambda line: None)
    assert search.gate.ranks == 3  # the gate a script's recipes are judged by


def _trajectory(losses: list[float]) -> Trajectory:
    return Trajectory(losses, {}, 0.0)


@pytest.mark.zoo
def test_an_inconclusive_ddp_bf16_trajectory_goes_to_the_digits_task() -> None:
    """Injected losses (a script's gradients are not read): finite but outside the bound."""
    reference = _trajectory([2.0, 1.8, 1.6, 1.4, 1.2, 1.0])
    noise = NumericsResult(verdict="pass", steps=6, loss_max_rel_diff=1e-3, grad_rel_diff=math.nan,
                           worst_param=None, worst_param_rel_diff=math.nan, detail="",
                           tolerance=Tolerance(math.inf, math.inf))
    calib = Calibration("bf16", reference, noise)
    candidate = _trajectory([2.0, 1.8, 1.6, 1.4, 1.2, 1.2])  # 20 % off at the end: outside max(0.05, 5e-3)
    recipe = RECIPES[DDP_BF16_ALLREDUCE]
    assert not judge_trajectory(calib, candidate, recipe.tolerance, GATE)[1]  # not conclusive
    verdict = judge(recipe, Arm(reference), candidate, ctx=Context(cpu_topology()), gate=GATE, rounding=None,
                    calibration=lambda precision: calib)
    assert verdict.numerics.passed, verdict.numerics.detail
    assert verdict.numerics.detail.startswith("trains the digits as well as stock: digits task (4 epochs; each "
                                              "batch split over 2 simulated ranks")
    assert "trajectory outside the bound" in verdict.numerics.detail
    broken = judge(ZeroedAllreduce(), Arm(reference), candidate, ctx=Context(cpu_topology()), gate=GATE,
                   rounding=None, calibration=lambda precision: calib)
    assert not broken.numerics.passed
    assert broken.numerics.detail.startswith("does not train the digits as well as stock: digits task")


def _inconclusive_pair() -> tuple[Calibration, list[float]]:
    """A stock calibration and a candidate's losses outside its bound but finite (not conclusive)."""
    reference = _trajectory([2.0, 1.8, 1.6, 1.4, 1.2, 1.0])
    noise = NumericsResult(verdict="pass", steps=6, loss_max_rel_diff=1e-3, grad_rel_diff=math.nan,
                           worst_param=None, worst_param_rel_diff=math.nan, detail="",
                           tolerance=Tolerance(math.inf, math.inf))
    return Calibration("bf16", reference, noise), [2.0, 1.8, 1.6, 1.4, 1.2, 1.2]


@pytest.mark.zoo
@pytest.mark.parametrize("reduction, passes", [(DdpBf16Allreduce, True), (ZeroedAllreduce, False)])
def test_the_final_check_of_the_accepted_recipes_together_settles_an_inconclusive_trajectory_on_the_digits(
        reduction: type[DdpBf16Allreduce], passes: bool) -> None:
    """A script's final check (every accepted recipe together) whose trajectory is not
    conclusive goes to the digits task as the BF16 recipe's own check did, trained with the
    mix's precision recipes (fused_optimizer, an arithmetic recipe, was judged by its own
    gate); before, it failed there and the report said the recipes together drift from stock."""
    calib, losses = _inconclusive_pair()
    search = ScriptSearch(["python", "train.py"], Settings.for_script(nproc_per_node=RANKS, warmup=2, child_steps=4),
                          Context(cpu_topology()), say=lambda line: None)
    search.stock = ArmOutput(calib.reference.losses, [], None)
    search._calibrations["bf16"] = calib  # the noise-floor run a real search makes first
    accepted = [RECIPES[FUSED_OPTIMIZER], reduction()]
    result = search.final_numerics(accepted, ArmOutput(losses, [], None))
    assert result.passed is passes, result.detail
    assert "trajectory outside the bound" in result.detail
    assert result.detail.startswith(("trains the digits as well as stock: digits task (6 epochs; each batch split "
                                     f"over {RANKS} simulated ranks") if passes
                                    else "does not train the digits as well as stock: digits task")


@pytest.mark.zoo
def test_two_precision_recipes_train_the_digits_together(native_bf16_cpu) -> None:
    """BF16 compute and the BF16 allreduce accepted together: the digits task trains the
    candidate with both (the allreduce's simulated ranks computing under BF16 autocast)."""
    outcome = digits_task([RECIPES[DTYPE_POLICY], RECIPES[DDP_BF16_ALLREDUCE]], Context(cpu_topology()), GATE)
    assert outcome.applied and outcome.passed, outcome.describe()
    assert outcome.how.startswith("dtype_policy + ddp_bf16_allreduce together; each batch split over 2 simulated")
    broken = digits_task([RECIPES[DTYPE_POLICY], ZeroedAllreduce()], Context(cpu_topology()), GATE)
    assert broken.applied and not broken.passed, broken.describe()


def test_two_recipes_with_arms_of_their_own_are_not_trained_together() -> None:
    outcome = digits_task([RECIPES[DDP_BF16_ALLREDUCE], ZeroedAllreduce()], Context(cpu_topology()), GATE)
    assert not outcome.applied and not outcome.passed
    assert outcome.describe() == ("digits task not run: ddp_bf16_allreduce and ddp_bf16_allreduce each train arms "
                                  "of their own")

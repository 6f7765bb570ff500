"""``optimize --nproc-per-node N -- python train.py``: every arm a real torchrun launch of a
DDP script (gloo, loopback) on 2 ranks, the slowest rank's step, rank 0's losses, the
ranks' parameters compared at each window's end; ``apply`` launches the same way; a script
with no process group and a rank that raises end with their own reasons."""

from __future__ import annotations

import json
import shutil
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
from ddp_scripts import DDP_BATCH_SCRIPT, NOT_DISTRIBUTED, RANK_ONE_RAISES, write_script

from profilednn.cli import run_cli
from profilednn.distributed.script_arms import LaunchedArms, NotDataParallel, merged_output, optimize_ddp_script
from profilednn.errors import InputError
from profilednn.optimization.results import OptimizeReport
from profilednn.optimization.script.job import optimize_script
from profilednn.optimization.script.runner import ArmError, ArmOutput
from profilednn.optimization.settings import Settings
from profilednn.run import Run, load_run

DDP_SCRIPT = textwrap.dedent("""
    import torch, torch.distributed as dist, torch.nn as nn
    dist.init_process_group("gloo")
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(dist.get_rank())
    for step in range(40):
        x, y = torch.randn(8, 32, generator=data), torch.randint(0, 4, (8,), generator=data)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    print(f"trained on rank {dist.get_rank()}", flush=True)
    dist.destroy_process_group()
""")


def _script(tmp_path: Path, name: str, text: str) -> str:
    return write_script(tmp_path, name, text)


def _quick(**given) -> Settings:  # noqa: ANN003
    """Few runs: no rounding-noise arm, no final total, no headroom or FLOPs run."""
    return Settings.for_script(nproc_per_node=2, threads=1, rounds=2, time_budget_s=0, calibrate_noise=False,
                               final_ab=False, headroom=False, measure_flops=False, **given)


# --------------------------------------------------------------------------- plain data
def _out(times: list[float]) -> ArmOutput:
    return ArmOutput(losses=[1.0, 0.9], times_ms=times, first_step_ms=times[0], step_ms=[50.0, *times])


def test_an_arm_of_ranks_is_the_slowest_rank_step_by_step() -> None:
    results = [{"facts": {"world_size": 2}, "param_digest": "ab"}] * 2
    merged = merged_output([_out([10.0, 30.0, 12.0]), _out([20.0, 11.0, 13.0])], results)
    assert merged.times_ms == [20.0, 30.0, 13.0]
    assert merged.losses == [1.0, 0.9]  # rank 0's


def test_ranks_out_of_sync_or_alone_are_refused() -> None:
    with pytest.raises(ArmError, match="rank 1's parameters differ from rank 0's"):
        merged_output([_out([1.0]), _out([1.0])], [{"facts": {"world_size": 2}, "param_digest": "a"},
                                                   {"facts": {"world_size": 2}, "param_digest": "b"}])
    with pytest.raises(NotDataParallel, match="never called torch.distributed.init_process_group"):
        merged_output([_out([1.0]), _out([1.0])], [{"facts": {"world_size": None}}] * 2)


def test_several_ranks_need_the_launching_runner(tmp_path: Path) -> None:
    script = _script(tmp_path, "train.py", DDP_SCRIPT)
    with pytest.raises(InputError, match="optimize_ddp_script"):
        optimize_script(["python", script], tmp_path / "runs", settings=_quick())
    code = run_cli(["optimize", "--nproc-per-node", "2", "--model", "small_cnn", "-o", str(tmp_path / "runs")])
    assert code != 0
    assert not (tmp_path / "runs").exists()


def test_channels_last_converts_the_model_before_ddp_builds_its_buckets() -> None:
    import torch
    from torch import nn

    from profilednn.optimization.layout import ChannelsLastRoots

    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 1))
    ChannelsLastRoots().ddp_arguments(None, {"module": model}, None)  # type: ignore[arg-type]
    assert all(m.weight.is_contiguous(memory_format=torch.channels_last) for m in model if isinstance(m, nn.Conv2d))


def test_under_several_ranks_threads_is_the_launch_plans_and_the_allocator_is_tried() -> None:
    from profilednn.optimization.engine import recipe_context
    from profilednn.optimization.recipes import select_recipes
    from profilednn.optimization.script.search import ScriptSearch
    from profilednn.optimization.search import SearchState

    chosen = select_recipes("threads,allocator")
    settings = _quick()
    arms = ScriptSearch(["python", "train.py"], settings, recipe_context(chosen, settings), lambda _: None)
    state = SearchState()
    reasons = {r.name: arms.applies(r, state) for r in chosen}
    assert "the launch plan sets each rank's threads" in reasons["threads"]
    assert reasons["allocator"] is None or "launch plan" not in reasons["allocator"]


# --------------------------------------------------------------------------- real launches
@pytest.fixture(scope="module")
def layout_job(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], Run, OptimizeReport]:
    """One optimize of a DDP script on 2 ranks with ``--batch-arg``, shared by the tests that
    assert on it (each launch of 2 ranks costs seconds): its argv, Run and report.

    A bar every layout clears within its rounds (two rounds' interval can still reach below
    0.01x on a busy machine), so that the chosen layout (1 rank x 2 threads) is what apply
    must launch, and fused_optimizer is accepted (the layout's A/B and the final run with it)."""
    folder = tmp_path_factory.mktemp("layout_job")
    script = _script(folder, "train.py", DDP_BATCH_SCRIPT)
    argv = ["python", script, "--batch-size", "8"]
    settings = replace(_quick(batch_arg="--batch-size", min_speedup=1e-6), rounds=4)
    run, report = optimize_ddp_script(argv, folder / "runs", ["fused_optimizer"], settings=settings)
    return argv, run, report


def _without_layout(run: Run, folder: Path) -> Run:
    """A copy of ``run`` as it would be had the launch given won (no layout chosen)."""
    copy = load_run(shutil.copytree(run.path, folder / run.path.name))
    copy.update(script={**copy.manifest["script"], "layout": None})
    return copy


def test_optimize_and_apply_a_ddp_script_on_two_ranks(layout_job, tmp_path: Path, capfd) -> None:  # noqa: ANN001
    argv, run, report = layout_job
    assert run.status == "complete"
    assert run.manifest["script"]["nproc_per_node"] == 2
    row = next(r for r in report.recipes if r.recipe == "fused_optimizer")
    assert row.applies and row.numerics == "pass", row.decision  # rank 0's losses against the stock job's
    assert row.rounds >= 2 and row.speedup_ci is not None
    assert any("pinned launch of 2 ranks" in n for n in report.notes)
    # final_ab off (the quick settings), as for a built-in: no final A/B and no total, but the
    # accepted recipes' numerics together still judged, on one run of the script's own layout
    assert report.final is None and report.speedup is None
    assert report.final_numerics is not None and report.final_numerics.passed, report.final_numerics
    capfd.readouterr()
    code = run_cli(["apply", str(_without_layout(run, tmp_path).path), "--", *argv])
    out = capfd.readouterr().out
    assert code == 0
    assert "trained on rank 0" in out and "trained on rank 1" in out  # the whole job, on both ranks


def test_a_script_without_a_process_group_stops_the_job(tmp_path: Path) -> None:
    script = _script(tmp_path, "alone.py", NOT_DISTRIBUTED)
    with pytest.raises(NotDataParallel, match="each rank trained alone"):
        optimize_ddp_script(["python", script], tmp_path / "runs", ["fused_optimizer"], settings=_quick())
    run = load_run(next((tmp_path / "runs").iterdir()))
    assert run.status == "failed"


def test_a_rank_that_raises_ends_the_arm_with_its_own_error(tmp_path: Path) -> None:
    script = _script(tmp_path, "dies.py", RANK_ONE_RAISES)
    spec = {"argv": ["python", script], "warmup": 1, "steps": 3, "seed": 0}
    with pytest.raises(ArmError, match=r"rank 1: the script raised ValueError: rank one cannot go on"):
        LaunchedArms(2, 1)(spec, {}, timeout_s=120)
    json.dumps(spec)  # the spec is left as given (the runner writes its own copy)
    assert "param_digest" not in spec


def test_numerics_judge_every_rank_against_the_same_rank() -> None:
    from profilednn.optimization.numerics import compare_trajectories
    from profilednn.optimization.recipe_contract import Tolerance
    from profilednn.optimization.script.runs import loss_trajectory

    results = [{"facts": {"world_size": 2}, "param_digest": "ab"}] * 2

    def arm(rank1: list[float]) -> ArmOutput:
        ranks = [ArmOutput(losses=[1.0, 0.9, 0.8], times_ms=[5.0], first_step_ms=5.0),
                 ArmOutput(losses=rank1, times_ms=[5.0], first_step_ms=5.0)]
        return merged_output(ranks, results)

    stock, same, drifted = arm([2.0, 1.8, 1.6]), arm([2.0, 1.8, 1.6]), arm([2.0, 1.8, 1.9])
    assert stock.losses == [1.0, 0.9, 0.8] and stock.rank_losses[1] == [2.0, 1.8, 1.6]
    assert loss_trajectory(stock, 2).losses == [1.0, 0.9, 2.0, 1.8]  # each rank's window, rank after rank
    tight = Tolerance(1e-3, float("inf"))
    assert compare_trajectories(loss_trajectory(stock, 3), loss_trajectory(same, 3), tight).passed
    moved = compare_trajectories(loss_trajectory(stock, 3), loss_trajectory(drifted, 3), tight)
    assert not moved.passed and moved.loss_max_rel_diff == pytest.approx(0.3 / 1.6)  # rank 1's third step
    assert loss_trajectory(ArmOutput(losses=[1.0, 0.5], times_ms=[], first_step_ms=None), 1).losses == [1.0]


# --------------------------------------------------------------------------- the layout as a choice
def test_other_layouts_keep_the_global_batch_and_apply_follows_the_chosen_one() -> None:
    from profilednn.distributed.layout_choice import launch_of, other_layouts

    argv = ["python", "t.py", "--batch-size", "8", "--epochs", "1"]
    (one,) = other_layouts(argv, 2, 1, "--batch-size", LaunchedArms)  # 2 cores: 1 x 2 is the other layout
    assert one.label == "1 rank x 2 threads" and one.argv == ["python", "t.py", "--batch-size", "16", "--epochs", "1"]
    assert one.record["global_batch"] == 16 and "global batch kept (16 a step" in one.why_same
    four = other_layouts(["python", "t.py", "--batch-size=6"], 2, 2, "--batch-size", LaunchedArms)  # global 12
    assert [(x.record["ranks"], x.record["threads"], x.argv[-1]) for x in four] == [
        (1, 4, "--batch-size=12"), (4, 1, "--batch-size=3")]
    with pytest.raises(InputError, match="the script's arguments do not give it"):
        other_layouts(["python", "t.py"], 2, 1, "--batch-size", LaunchedArms)
    plan = {"nproc_per_node": 2, "threads": 1, "layout": one.record}
    assert launch_of(plan, ["python", "t.py", "--batch-size", "32"]) == (1, 2,
                                                                       ["python", "t.py", "--batch-size", "64"])
    assert launch_of({**plan, "layout": None}, argv) == (2, 1, argv)
    with pytest.raises(InputError, match="give the script's --batch-size"):
        launch_of(plan, ["python", "t.py"])


@pytest.mark.parametrize(("given", "said"), [
    ({"batch_arg": "--batch-size"}, "with --nproc-per-node 2 or more"),
    ({"batch_arg": "batch-size", "nproc_per_node": 2}, "not 'batch-size'"),
])
def test_a_bad_batch_arg_is_one_line(given: dict, said: str) -> None:
    with pytest.raises(InputError, match=said):
        Settings.for_script(**given).check_script()


def test_optimize_tries_the_other_layout_and_apply_launches_the_chosen_one(layout_job, capfd) -> None:  # noqa: ANN001
    argv, run, report = layout_job
    row = next(r for r in report.recipes if r.recipe == "layout")
    assert row.reason == "1 rank x 2 threads instead of the launch given" and row.accepted, row.decision
    assert row.numerics == "not compared" and "global batch kept (16 a step" in row.tolerance
    assert run.manifest["script"]["layout"]["ranks"] == 1
    capfd.readouterr()
    assert run_cli(["apply", str(run.path), "--", *argv]) == 0
    out = capfd.readouterr().out
    assert "trained on rank 0 of 1 with batch 16" in out and "rank 1" not in out

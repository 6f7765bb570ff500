"""The trainer in one process: data sharding, checkpoints and resume, merged view,
alpha-beta fit, projection, report sections, per-rank capture."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
import torch

from profilednn.distributed.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint
from profilednn.distributed.comm import AlphaBeta, BucketTimer, fit_alpha_beta, ring_allreduce_s
from profilednn.distributed.data import PoolBatches, TensorDatasetBatches, shard
from profilednn.distributed.merge import STEP_SCHEMA, merge_job, merge_rank_steps
from profilednn.distributed.projection import NodeProjection
from profilednn.distributed.report import report_sections
from profilednn.distributed.trainer import TrainConfig, maybe_inject_fault, resolve_batches, train
from profilednn.errors import InputError, WorkloadError
from profilednn.run import create_run
from profilednn.tables import DIST_PROJECTION, DIST_RANKS


def test_rank_slices_of_a_global_batch_concatenate_to_it() -> None:
    x = torch.arange(40.0).reshape(20, 2)
    y = torch.arange(20)
    whole = TensorDatasetBatches(x, y, 8, 0, 1, seed=3)
    parts = [TensorDatasetBatches(x, y, 8, r, 2, seed=3) for r in range(2)]
    for step in (0, 1, 2, 5):  # crosses epochs (2 steps per epoch)
        wx, wy = whole.batch(step)
        assert torch.equal(torch.cat([p.batch(step)[0] for p in parts]), wx)
        assert torch.equal(torch.cat([p.batch(step)[1] for p in parts]), wy)
    assert not torch.equal(whole.batch(0)[1], whole.batch(2)[1])  # reshuffled each epoch
    pool = [(torch.arange(4.0), {"t": torch.arange(4)})]
    halves = [PoolBatches.from_pool(pool, r, 2).batch(7) for r in range(2)]
    assert torch.equal(torch.cat([h[0] for h in halves]), pool[0][0])
    assert halves[1][1]["t"].tolist() == [2, 3]
    with pytest.raises(WorkloadError, match="does not split evenly"):
        shard(torch.zeros(5), 0, 2)


def test_batch_sizes_resolve_from_local_or_global() -> None:
    assert resolve_batches(TrainConfig(model="digits", global_batch=32), 4) == (8, 32)
    assert resolve_batches(TrainConfig(model="digits", batch_size=8), 4) == (8, 32)
    assert resolve_batches(TrainConfig(model="small_cnn"), 2) == (32, 64)
    with pytest.raises(WorkloadError, match="multiple of the 3 ranks"):
        resolve_batches(TrainConfig(model="digits", global_batch=32), 3)


def _params(ckpt_dir: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(latest_checkpoint(ckpt_dir))["model"]


def test_resume_continues_at_the_checkpoint_and_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    base = dict(model="digits", global_batch=64, lr=0.05, checkpoint_every=2, runs_dir=tmp_path / "runs")
    straight = train(TrainConfig(steps=6, checkpoint_dir=tmp_path / "a", **base))
    assert straight.start_step == 0 and straight.steps == 6
    first = train(TrainConfig(steps=4, checkpoint_dir=tmp_path / "b", **base))
    assert [s for s, _ in list_checkpoints(tmp_path / "b")] == [2, 4]
    resumed = train(TrainConfig(steps=6, checkpoint_dir=tmp_path / "b", **base))
    assert resumed.start_step == 4 and resumed.run.table("dist_steps")["step"].to_list() == [4, 5]
    assert resumed.run.manifest["distributed"]["resumed_from"].endswith("step-00000004.pt")
    a, b = _params(tmp_path / "a"), _params(tmp_path / "b")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert first.final_loss is not None and resumed.final_loss != first.final_loss
    with pytest.raises(InputError, match="global batch 64, not digits at 32"):
        train(TrainConfig(steps=8, checkpoint_dir=tmp_path / "b", **{**base, "global_batch": 32}))


def test_checkpoints_are_atomic_and_pruned(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, {"x": torch.ones(2) * step}, keep=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 3]
    assert not list(tmp_path.glob(".*.tmp"))
    (tmp_path / "step-00000009.pt.partial").write_bytes(b"torn")  # never picked up
    assert load_checkpoint(latest_checkpoint(tmp_path))["step"] == 3
    (tmp_path / "step-00000010.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(InputError, match="cannot read checkpoint"):
        load_checkpoint(tmp_path / "step-00000010.pt")


def test_train_validates_its_knobs(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="--steps N or --epochs E"):
        train(TrainConfig(model="digits", runs_dir=tmp_path))
    with pytest.raises(WorkloadError, match="unknown workload"):
        train(TrainConfig(model="nope", steps=1, runs_dir=tmp_path))
    with pytest.raises(InputError, match="KIND:RANK:STEP"):
        maybe_inject_fault("exit-1-5", 1, 5, 0)
    maybe_inject_fault("exit:1:5", 1, 5, attempt=1)  # restarted attempts never fault
    maybe_inject_fault("exit:1:5", 0, 5, attempt=0)  # another rank: nothing happens


def _steps(rank: int, compute: float, comm: float, n: int = 5) -> list[dict]:
    return [{"rank": rank, "step": s, "time_ms": compute + comm, "loss": 1.0, "data_ms": 0.1, "forward_ms": compute / 3,
             "backward_ms": 2 * compute / 3 + comm, "optimizer_ms": 0.0, "allreduce_ms": comm,
             "exposed_comm_ms": comm / 2, "compute_ms": compute, "buckets": 1, "allreduce_bytes": 4000}
            for s in range(n)]


def test_merged_view_finds_the_straggler() -> None:
    rows = _steps(0, 10.0, 6.0) + _steps(1, 10.2, 5.8) + _steps(2, 15.0, 1.0) + _steps(3, 9.9, 6.1)
    view = merge_rank_steps(pl.DataFrame(rows, schema=STEP_SCHEMA), warmup=1)
    assert view.stragglers == [2]
    per = {r["rank"]: r for r in view.per_rank.iter_rows(named=True)}
    assert per[2]["slowest_steps"] == 4 and per[0]["slowest_steps"] == 0  # warm-up step left out
    assert per[0]["comm_share"] == pytest.approx(3.0 / 16.0)
    assert view.step_ms == pytest.approx(16.0)
    assert view.items_per_s(32) == pytest.approx(2000.0)
    assert view.per_rank.schema == pl.Schema(DIST_RANKS.schema)  # the catalogue's columns, in its order


def test_bucket_timer_counts_overlapping_buckets_once() -> None:
    t = BucketTimer(world_size=2, intervals=[(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)], starts=[0.0, 1.0, 5.0])
    assert t.busy_s() == pytest.approx(4.0) and t.last_start == 5.0


def test_alpha_beta_fit_recovers_the_model() -> None:
    alpha, beta = 30e-6, 1 / 5e9
    sizes = [2 ** k for k in range(10, 24, 2)]
    table = pl.DataFrame({"bytes": sizes, "ranks": [4] * len(sizes),
                          "median_s": [ring_allreduce_s(n, 4, alpha, beta) for n in sizes]})
    fit = fit_alpha_beta(table)
    assert fit.alpha_s == pytest.approx(alpha, rel=1e-3)
    assert fit.bandwidth_gbps == pytest.approx(5.0, rel=1e-3)
    with pytest.raises(ValueError):
        fit_alpha_beta(table.with_columns(pl.lit(1).alias("ranks")))


def test_projection_efficiency_falls_with_nodes_and_is_ideal_without_comm() -> None:
    ab = AlphaBeta(50e-6, 1 / 1.25e9, 2, "given")  # ~10 GbE
    proj = NodeProjection(compute_ms=100.0, grad_bytes=100e6, ranks_per_node=2, local_batch=32, alpha_beta=ab)
    t = proj.table(64)
    assert t["nodes"].to_list() == [1, 2, 4, 8, 16, 32, 64]
    eff = t["efficiency"].to_list()
    assert eff[0] == pytest.approx(1.0) and all(a >= b for a, b in zip(eff, eff[1:])) and eff[-1] < 0.75
    assert t["global_batch"].to_list()[-1] == 64 * 2 * 32
    free = NodeProjection(100.0, 100e6, 2, 32, AlphaBeta(0.0, 0.0, 2), overlap=0.0).table(8)
    assert free["efficiency"].to_list() == pytest.approx([1.0] * 4)
    hidden = NodeProjection(100.0, 100e6, 2, 32, ab, overlap=1.0).table(8)
    assert hidden["efficiency"].to_list() == pytest.approx([1.0] * 4)
    assert t.schema == pl.Schema(DIST_PROJECTION.schema)


def test_report_sections_and_merged_view_of_a_one_process_job(tmp_path: Path) -> None:
    result = train(TrainConfig(model="small_cnn", batch_size=4, image_size=16, steps=3, runs_dir=tmp_path,
                               job_id="solo"))
    run = result.run
    assert run.status == "complete" and run.table("dist_ranks").height == 1
    assert run.table("steps")["time_ms"].len() == 3
    titles = [s.title for s in report_sections(run)]
    assert titles == ["Distributed training"]
    assert "Merged view" in report_sections(run)[0].html
    assert report_sections(create_run(tmp_path / "other", label="plain")) == []
    assert merge_job(tmp_path / "solo").per_rank["rank"].to_list() == [0]


@pytest.mark.timeout(120)
def test_capture_mode_profiles_a_window_then_trains_on(tmp_path: Path) -> None:
    result = train(TrainConfig(model="small_cnn", batch_size=4, image_size=16, steps=4, warmup=1, capture=True,
                               capture_steps=1, runs_dir=tmp_path, job_id="cap"))
    run = result.run
    assert run.status == "complete"
    assert run.has_table("primitives") and run.has_table("layers")  # the capture's tables
    assert run.table("dist_steps")["step"].to_list() == [0, 1, 2, 3]  # every step, profiled or not
    assert run.manifest["distributed"]["rank"] == 0


def test_a_merge_that_fails_after_the_capture_window_leaves_the_run_failed(tmp_path: Path, monkeypatch) -> None:
    from profilednn.distributed import trainer
    from profilednn.run import load_run

    def broken_merge(*args, **kwargs):
        raise RuntimeError("merge broke")

    monkeypatch.setattr(trainer, "merge_rank_steps", broken_merge)
    cfg = TrainConfig(model="small_cnn", batch_size=4, image_size=16, steps=2, warmup=1, capture=True,
                      capture_steps=3, runs_dir=tmp_path, job_id="capfail")  # the window outlasts training
    with pytest.raises(RuntimeError, match="merge broke") as info:
        train(cfg)
    run = load_run(info.value.run.path)
    assert run.status == "failed" and run.has_table("primitives")

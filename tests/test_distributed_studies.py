"""The studies at tiny sizes: convergence vs global batch, the ranks x threads sweep,
weak scaling, and the projection to more nodes (the sweeps run real torchrun jobs)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from profilednn.cli import run_cli
from profilednn.distributed.comm import AlphaBeta
from profilednn.distributed.convergence import convergence_advice, convergence_study, scaled_lr
from profilednn.distributed.merge import rank_runs
from profilednn.distributed.projection import project_nodes
from profilednn.distributed.report import report_sections
from profilednn.distributed.scale import scale_sweep, weak_scaling
from profilednn.errors import InputError, RunError
from profilednn.tables import CONVERGENCE


def test_larger_global_batch_needs_more_epochs(tmp_path: Path) -> None:
    result = convergence_study([16, 512], target=0.9, max_epochs=40, lr=0.05, lr_scaling="none", seeds=[0],
                               ranks=[4], runs_dir=tmp_path)
    rows = {r["global_batch"]: r for r in result.table.iter_rows(named=True)}
    assert rows[16]["epochs_to_target"] is not None and rows[512]["epochs_to_target"] is not None
    assert rows[512]["epochs_to_target"] > rows[16]["epochs_to_target"]
    assert rows[16]["convergence_ratio"] == pytest.approx(1.0) and rows[512]["convergence_ratio"] > 1.0
    assert result.run.table(CONVERGENCE).schema == pl.Schema(CONVERGENCE.schema)
    assert any("with 4 ranks keep the local batch" in a for a in result.advice)
    assert (result.run.path / "convergence.png").stat().st_size > 0
    assert [s.title for s in report_sections(result.run)] == ["Convergence vs global batch"]
    assert scaled_lr(0.1, 128, 32, "linear") == pytest.approx(0.4)
    assert scaled_lr(0.1, 128, 32, "sqrt") == pytest.approx(0.2)
    with pytest.raises(InputError, match="outside 1.."):
        convergence_study([4096], runs_dir=tmp_path)


def test_an_interrupted_study_leaves_its_run_interrupted(tmp_path: Path) -> None:
    from profilednn.run import iter_runs

    def stop(done: int, total: int, label: str) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        convergence_study([16], target=0.9, max_epochs=1, seeds=[0], runs_dir=tmp_path, progress=stop)
    [run] = list(iter_runs(tmp_path))
    assert run.status == "interrupted" and run.manifest["exit_code"] == 130


def test_convergence_advice_when_nothing_converges() -> None:
    import polars as pl

    table = pl.DataFrame({"global_batch": [64], "epochs_to_target": [None]}, schema={"global_batch": pl.Int64,
                                                                                  "epochs_to_target": pl.Int64})
    assert "lower --target" in convergence_advice(table)[0]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_rank_thread_sweep_weak_scaling_and_projection(tmp_path: Path) -> None:
    strong = scale_sweep("small_cnn", 2, 4, ranks=[1, 2], threads=[1], steps=3, warmup=1, runs_dir=tmp_path,
                         image_size=16)
    t = strong.table.sort("ranks")
    assert t["ranks"].to_list() == [1, 2] and t["global_batch"].to_list() == [4, 4]
    assert t["local_batch"].to_list() == [4, 2]
    assert t["normalized"][0] == pytest.approx(1.0) and t["normalized"][1] > 0
    assert t["exposed_comm_ms"][0] == 0.0 and t["allreduce_ms"][1] > 0  # one rank has nothing to reduce
    assert strong.pivot().columns == ["threads", "1", "2"]
    assert (strong.run.path / "scale.png").stat().st_size > 0
    assert "Scaling study" in [s.title for s in report_sections(strong.run)]

    weak = weak_scaling("small_cnn", 2, 2, ranks=[2], steps=3, warmup=1, runs_dir=tmp_path, image_size=16)
    assert weak.table["global_batch"].to_list() == [4] and weak.table["mode"][0] == "weak"

    # Projection from the 2-rank job of the sweep, on a given network (it ran with --no-comm).
    job = strong.run.path / "jobs" / "r2t1"
    with pytest.raises(RunError, match="--alpha-us"):
        project_nodes(job)
    table, notes, rank0 = project_nodes(job, alpha_beta=AlphaBeta(20e-6, 1 / 1.25e9, 2, "given"), max_nodes=8)
    assert table["nodes"].to_list() == [1, 2, 4, 8]
    assert table["efficiency"][0] == pytest.approx(1.0) and table["efficiency"][-1] <= 1.0
    assert rank0.has_table("dist_projection")
    assert "Projection to more nodes" in [s.title for s in report_sections(rank0)]
    with pytest.raises(RunError, match="one rank"):
        project_nodes(strong.run.path / "jobs" / "r1t1", alpha_beta=AlphaBeta(1e-6, 1e-9, 2))

    # The CLI views of the same job.
    assert run_cli(["ranks", str(job)]) == 0
    assert run_cli(["project-nodes", str(rank_runs(job)[0].path), "--alpha-us", "20", "--bandwidth-gbps", "1.25",
                    "--max-nodes", "4"]) == 0
    assert run_cli(["project-nodes", str(job), "--alpha-us", "20"]) == 2  # needs both network numbers

"""Real distributed jobs on this machine (loopback only): launch, two nodes, faults, resume.

Each test starts torchrun through ``profilednn launch`` with the digits MLP (gloo over
127.0.0.1), so each costs a few seconds of Python + torch start-up per rank.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import torch

from profilednn.distributed.checkpoint import latest_checkpoint, load_checkpoint
from profilednn.distributed.launch import free_port
from profilednn.distributed.merge import merge_job, rank_runs
from profilednn.distributed.projection import project_nodes
from profilednn.report import report_run
from profilednn.run import load_run
from profilednn.tables import DIST_COMM
from profilednn.workloads.digits import digits_mlp
from profilednn.distributed.trainer import ENV_FAULT, TrainConfig, train

pytestmark = [pytest.mark.slow, pytest.mark.zoo]  # the digits come with scikit-learn

PY = sys.executable
# Parameters of W ranks under DDP vs one process on the same global batch: the averaged
# gradient is summed in another order (x/2 + y/2 vs the mean of 32), so equality holds to
# float32 rounding carried through a few SGD steps, not bit for bit.
RTOL, ATOL = 1e-5, 1e-6


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop(ENV_FAULT, None)
    env.update(extra)
    return env


def _launch(args: list[str], *, env: dict[str, str] | None = None, timeout: float = 150) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "profilednn", "launch", *args], capture_output=True, text=True,
                          timeout=timeout, env=env or _env(), check=False)


def _train_args(tmp: Path, steps: int, global_batch: int, extra: list[str] = (), comm: bool = False) -> list[str]:
    return ["--", "python", "-m", "profilednn", "train", "--model", "digits", "--steps", str(steps),
            "--global-batch", str(global_batch), "--lr", "0.05", "-o", str(tmp / "runs"),
            *([] if comm else ["--no-comm"]), *extra]


def _reference_params(tmp: Path, steps: int, global_batch: int) -> dict[str, torch.Tensor]:
    """One process, whole global batch, same data order: the parameters DDP must reproduce."""
    ref = tmp / "ref-ckpt"
    train(TrainConfig(model="digits", steps=steps, global_batch=global_batch, lr=0.05,
                      checkpoint_dir=ref, checkpoint_every=steps, runs_dir=tmp / "ref-runs", measure_comm=False))
    return load_checkpoint(latest_checkpoint(ref))["model"]


@pytest.mark.timeout(240)
def test_two_ranks_killed_and_resumed_match_single_process(tmp_path: Path) -> None:
    """Rank 1 dies before step 3 on the first attempt; torchrun restarts the job, which
    resumes from the step-2 checkpoint and ends with the parameters of one process
    trained on the same global batch."""
    ckpt = tmp_path / "ckpt"
    res = _launch(["--nproc-per-node", "2", "--max-restarts", "1", "--timeout", "200", "--job-id", "resume",
                   *_train_args(tmp_path, 6, 32, ["--checkpoint-dir", str(ckpt), "--checkpoint-every", "2"])],
                  env=_env(**{ENV_FAULT: "exit:1:3"}))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "plan: 2 ranks x 1 threads" in res.stdout
    assert "injected fault 'exit' on rank 1 at step 3" in res.stderr

    runs = rank_runs(tmp_path / "runs" / "resume")
    assert [r.manifest["distributed"]["rank"] for r in runs] == [0, 1]
    for run in runs:  # the newest attempt of each rank: restarted, resumed at step 2, finished
        d = run.manifest["distributed"]
        assert d["attempt"] == 1 and d["start_step"] == 2 and d["world_size"] == 2
        assert run.status == "complete"
        assert run.table("dist_steps")["step"].to_list() == [2, 3, 4, 5]
        assert len(d["cpus"]) == 1  # pinned to its own core by rank_entry
    assert runs[0].manifest["distributed"]["cpus"] != runs[1].manifest["distributed"]["cpus"]
    assert load_checkpoint(latest_checkpoint(ckpt))["step"] == 6

    got = load_checkpoint(latest_checkpoint(ckpt))["model"]
    want = _reference_params(tmp_path, 6, 32)
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=RTOL, atol=ATOL, msg=name)
    initial = digits_mlp(seed=0).state_dict()  # and training did move them
    assert not torch.allclose(got["0.weight"], initial["0.weight"], rtol=RTOL, atol=ATOL)

    view = merge_job(tmp_path / "runs" / "resume")
    assert view.per_rank["rank"].to_list() == [0, 1]
    assert (view.per_rank["allreduce_ms"] > 0).all()


@pytest.mark.timeout(200)
def test_killed_rank_ends_job_with_clear_error(tmp_path: Path) -> None:
    res = _launch(["--nproc-per-node", "2", "--timeout", "150", "--pg-timeout", "30",
                   *_train_args(tmp_path, 50, 16)], env=_env(**{ENV_FAULT: "kill:1:1"}))
    assert res.returncode == 1
    err = " ".join(res.stderr.split())
    assert "failed: rank 1 (local rank 1" in err and "killed by SIGKILL" in err, err[-2000:]


@pytest.mark.timeout(200)
def test_hung_rank_ends_job_at_process_group_timeout(tmp_path: Path) -> None:
    res = _launch(["--nproc-per-node", "2", "--timeout", "150", "--pg-timeout", "8",
                   *_train_args(tmp_path, 50, 16)], env=_env(**{ENV_FAULT: "hang:1:1"}))
    assert res.returncode == 1
    err = " ".join(res.stderr.split())
    assert "error: job" in err and "failed: rank" in err, err[-2000:]
    assert "did not finish within" not in err  # the process-group timeout ended it, not the watchdog


@pytest.mark.timeout(200)
def test_two_nodes_on_loopback_with_c10d_rendezvous(tmp_path: Path) -> None:
    port = free_port()
    common = ["--nnodes", "2", "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
              "--threads-per-rank", "1", "--timeout", "150", "--job-id", "twonodes"]
    train_args = _train_args(tmp_path, 3, 16, comm=True)
    node0 = subprocess.Popen([PY, "-m", "profilednn", "launch", *common, "--node-rank", "0", *train_args],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        node1 = _launch([*common, "--node-rank", "1", *train_args], timeout=170)
        out0, err0 = node0.communicate(timeout=170)
    finally:
        if node0.poll() is None:
            node0.kill()
    assert node0.returncode == 0, out0[-2000:] + err0[-2000:]
    assert node1.returncode == 0, node1.stdout[-2000:] + node1.stderr[-2000:]
    runs = rank_runs(tmp_path / "runs" / "twonodes")
    assert sorted(r.manifest["distributed"]["rank"] for r in runs) == [0, 1]
    assert {r.manifest["distributed"]["world_size"] for r in runs} == {2}
    rank0 = next(r for r in runs if r.manifest["distributed"]["rank"] == 0)
    assert rank0.table("dist_ranks").height == 2  # merged view gathered over the two "nodes"
    assert rank0.table(DIST_COMM).schema == pl.Schema(DIST_COMM.schema)

    # The allreduce was measured at the end; project from it and render the Run's report.
    ab = rank0.manifest["alpha_beta"]
    assert ab["ranks"] == 2 and ab["alpha_s"] >= 0 and ab["bandwidth_gbps"] > 0
    table, notes, _ = project_nodes(rank0.path, max_nodes=64, ranks_per_node=1)
    assert table["nodes"].to_list() == [1, 2, 4, 8, 16, 32, 64]
    assert any("measured on this machine" in n for n in notes)
    html = report_run(load_run(rank0.path)).read_text()
    assert "Merged view" in html and "Allreduce cost" in html and "Projection to more nodes" in html


@pytest.mark.timeout(120)
def test_watchdog_ends_a_job_that_runs_past_timeout(tmp_path: Path) -> None:
    res = _launch(["--nproc-per-node", "1", "--timeout", "6", "--", "python", "-c",
                   "import time; time.sleep(300)"])
    assert res.returncode == 1
    assert "did not finish within --timeout 6 s" in " ".join(res.stderr.split())


@pytest.mark.timeout(60)
def test_bad_plans_fail_before_anything_starts(tmp_path: Path) -> None:
    too_many = _launch(["--nproc-per-node", "64", "--", "python", "-c", "print('started')"], timeout=50)
    assert too_many.returncode == 1 and "started" not in too_many.stdout
    assert "physical cores" in too_many.stderr
    port = free_port()
    unreachable = _launch(["--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "1", "--master-addr",
                           "127.0.0.1", "--master-port", str(port), "--rdzv-timeout", "2", "--",
                           "python", "-c", "print('started')"], timeout=50)
    assert unreachable.returncode == 1 and "started" not in unreachable.stdout
    assert "cannot reach the master 127.0.0.1" in " ".join(unreachable.stderr.split())

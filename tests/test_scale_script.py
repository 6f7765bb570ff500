"""``profilednn scale -- python train.py``: the ranks x threads study of a user's own DDP
script (real torchrun launches on loopback, gloo), its parts on plain data (the batch
option, the compute vs allreduce split of profiler spans) and its bad input."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import polars as pl
import pytest
from ddp_scripts import NOT_DISTRIBUTED, RANK_ONE_RAISES, write_script

from profilednn.capture.comm_split import Span, comm_split, union_us
from profilednn.cli import run_cli
from profilednn.distributed.script_scale import (
    LayoutFailed, NotDistributed, batch_notes, batch_value, layout_row, normalise, scale_script, weak_script,
    with_batch,
)
from profilednn.errors import InputError, ProfileDNNError
from profilednn.run import load_run
from profilednn.tables import SCALE

DDP_SCRIPT = textwrap.dedent("""
    import argparse
    import torch, torch.distributed as dist, torch.nn as nn
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(dist.get_rank())
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(50):
        x, y = torch.randn(args.batch_size, 32), torch.randint(0, 4, (args.batch_size,))
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    print("trained", flush=True)
    dist.destroy_process_group()
""")


def _script(tmp_path: Path, name: str, text: str) -> str:
    return write_script(tmp_path, name, text)


# --------------------------------------------------------------------------- plain data
def test_the_batch_option_is_read_and_set_in_both_spellings() -> None:
    argv = ["python", "train.py", "--batch-size", "32", "--lr", "0.1"]
    assert batch_value(argv, "--batch-size") == 32
    assert batch_value(["python", "train.py", "--batch-size=16"], "--batch-size") == 16
    assert batch_value(argv, "--bs") is None
    assert with_batch(argv, "--batch-size", 8) == ["python", "train.py", "--batch-size", "8", "--lr", "0.1"]
    assert with_batch(["python", "train.py", "--batch-size=16"], "--batch-size", 4) == [
        "python", "train.py", "--batch-size=4"]
    assert with_batch(["python", "train.py"], "-b", 4) == ["python", "train.py", "-b", "4"]
    with pytest.raises(InputError, match="not an integer"):
        batch_value(["python", "train.py", "--batch-size", "big"], "--batch-size")


def _ddp_step(t0: float, backward_end: float, reduces: list[tuple[float, float]], opt: float) -> list[Span]:
    """One DDP step as the profiler sees it: backward ops on thread 1, the backend's
    collectives on thread 7, the optimizer step at ``opt``."""
    spans = [Span("autograd::engine::evaluate_function: AddmmBackward0", 1, t0 + 1, backward_end)]
    spans += [Span("c10d::allreduce_", 1, a - 1, a - 0.5) for a, _ in reduces]
    spans += [Span("gloo:all_reduce", 7, a, b) for a, b in reduces]
    return spans + [Span("Optimizer.step#SGD.step", 1, opt, opt + 5)]


def test_exposed_communication_is_the_wait_after_backward() -> None:
    # step 1: buckets reduced 10-30 and 25-60 while backward ends at 40: 50 us busy, 20 exposed
    # step 2: one bucket 110-120, backward ends at 130: hidden entirely
    spans = _ddp_step(0, 40, [(10, 30), (25, 60)], 70) + _ddp_step(75, 130, [(110, 120)], 140)
    split = comm_split(spans)
    assert split is not None and split.steps == 2
    assert split.allreduce_ms == pytest.approx((50 + 10) / 2 / 1e3)
    assert split.exposed_ms == pytest.approx((20 + 0) / 2 / 1e3)
    assert split.step_ms == pytest.approx((74 + 70) / 2 / 1e3)  # from the first event, cut at the optimizer steps' ends
    assert comm_split(spans, max_steps=1).exposed_ms == pytest.approx(20 / 1e3)
    assert comm_split([Span("aten::mm", 1, 0, 5)]) is None
    assert union_us([(0, 10), (5, 20), (30, 31)]) == 21


def _result(step_ms: float, batch: int | None, world: int | None, exposed: float = 0.0) -> dict:
    """One rank's arm result: its timed steps, its process group, its profiled steps' comm."""
    profiled = 2 * step_ms  # the profiler's steps are slower: the shares carry over, not the ms
    return {"times_ms": [step_ms] * 3,
            "comm": {"allreduce_ms": 4 * exposed, "exposed_ms": 2 * exposed, "step_ms": profiled, "collectives": 2},
            "facts": {"roots": [{"module_type": "DistributedDataParallel", "batch": batch}], "world_size": world}}


def test_a_layout_row_takes_the_slowest_rank_and_says_what_the_batch_did() -> None:
    row = layout_row([_result(100.0, 16, 2, 10.0), _result(120.0, 16, 2, 30.0)], 2, 1, "r2t1", None)
    assert row["step_ms"] == 120.0 and row["global_batch"] == 32 and row["local_batch"] == 16
    assert row["compute_ms"] == 90.0 and row["exposed_comm_ms"] == 20.0
    assert row["items_per_s"] == pytest.approx(32 / 0.12)
    one = layout_row([_result(60.0, 16, None)], 1, 1, "r1t1", None)
    rows = [one, row]
    assert normalise(rows, weak=False) is one and row["efficiency"] == pytest.approx(row["normalized"] / 2)
    notes = batch_notes(rows, 16, kept=False)
    assert "2x1: 32" in notes[0] and "--batch-arg" in notes[0] and "epochs" in notes[0]
    assert batch_notes(rows, 16, kept=True)[0].startswith("every layout trained the global batch 16")
    assert "could not be read" in batch_notes(rows, None, kept=False)[0]
    with pytest.raises(NotDistributed, match="never called torch.distributed.init_process_group"):
        layout_row([_result(10.0, 4, None), _result(10.0, 4, None)], 2, 1, "r2t1", None)
    lonely = [{**_result(10.0, 4, 2), "comm": {"collectives": 0, "step_ms": 12.0}} for _ in range(2)]
    with pytest.raises(NotDistributed, match="ran no collective"):  # a process group, but no DDP
        layout_row(lonely, 2, 1, "r2t1", None)


# --------------------------------------------------------------------------- real launches
def test_table_3_of_a_ddp_script_on_two_cores(tmp_path: Path) -> None:
    script = _script(tmp_path, "train.py", DDP_SCRIPT)
    result = scale_script(["python", script, "--batch-size", "8"], 2, ranks=[1, 2], threads=[1], steps=3,
                          warmup=1, runs_dir=tmp_path / "runs")
    rows = {r["ranks"]: r for r in result.table.iter_rows(named=True)}
    assert set(rows) == {1, 2}
    assert [rows[1]["local_batch"], rows[1]["global_batch"]] == [8, 8]
    assert [rows[2]["local_batch"], rows[2]["global_batch"]] == [8, 16]
    assert rows[1]["allreduce_ms"] == 0.0 and rows[2]["allreduce_ms"] > 0.0
    assert 0.0 <= rows[2]["exposed_comm_ms"] <= rows[2]["step_ms"]
    assert rows[1]["normalized"] == pytest.approx(1.0)
    assert any("global batch differs from the script's 8" in n for n in result.notes)
    run = load_run(result.run.path)
    assert run.manifest["status"] == "complete" and run.manifest["workload"]["kind"] == "script"
    assert run.table(SCALE).schema == pl.Schema(SCALE.schema)
    spec = json.loads((result.run.path / "jobs" / "r2t1" / "spec.json").read_text())
    assert spec["comm_steps"] > 0 and spec["argv"][1] == script
    assert "trained" not in (result.run.path / "jobs" / "r2t1" / "output.log").read_text()  # left at the window


def test_batch_arg_keeps_the_global_batch_and_weak_keeps_the_local(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    script = _script(tmp_path, "train.py", DDP_SCRIPT)
    code = run_cli(["scale", "--ranks", "1,2", "--threads", "1", "--steps", "2", "--warmup", "1",
                    "--batch-arg=--batch-size", "-o", str(tmp_path / "runs"), "--wide", "--",
                    "python", script, "--batch-size", "8"])
    out = " ".join(capsys.readouterr().out.split())  # the terminal wraps long titles and notes
    assert code == 0, out
    assert "normalized throughput, global batch 8" in out and "every layout trained the global batch 8" in out
    strong = load_run(sorted((tmp_path / "runs").glob("*scale-strong*"))[0]).table(SCALE)
    assert sorted(zip(strong["ranks"], strong["local_batch"], strong["global_batch"])) == [(1, 8, 8), (2, 4, 8)]
    weak = weak_script(["python", script, "--batch-size", "4"], 2, ranks=[1, 2], steps=2, warmup=1,
                       runs_dir=tmp_path / "runs")
    assert sorted(zip(weak.table["ranks"], weak.table["global_batch"])) == [(1, 4), (2, 8)]
    assert weak.table["mode"].to_list() == ["weak", "weak"]
    assert any("weak scaling: the script's per-rank batch (4) kept" in n for n in weak.notes)


def test_a_script_without_a_process_group_is_refused_under_two_ranks(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    script = _script(tmp_path, "alone.py", NOT_DISTRIBUTED)
    code = run_cli(["scale", "--ranks", "2", "--threads", "1", "--steps", "2", "--warmup", "1",
                    "-o", str(tmp_path / "runs"), "--", "python", script])
    err = " ".join(capsys.readouterr().err.split())
    assert code != 0 and "never called torch.distributed.init_process_group" in err
    run = load_run(sorted((tmp_path / "runs").glob("*scale-strong*"))[0])
    assert run.manifest["status"] == "failed"


def test_a_rank_that_raises_is_named_with_its_own_error(tmp_path: Path) -> None:
    script = _script(tmp_path, "dies.py", RANK_ONE_RAISES)
    with pytest.raises(LayoutFailed, match=r"rank 1: the script raised ValueError: rank one cannot go on"):
        scale_script(["python", script], 2, ranks=[2], threads=[1], steps=3, warmup=1, runs_dir=tmp_path / "runs")


@pytest.mark.parametrize(("args", "message"), [
    (["--cores", "64"], "physical cores"),
    (["--ranks", "4"], "no ranks x threads combination fits"),
    (["--global-batch", "8"], "--global-batch needs --batch-arg"),
    (["--batch-arg=--bs"], "the script's arguments do not give it"),
    (["--batch-arg=bs"], "takes the script's option"),
    (["--model", "small_cnn"], "--model applies to built-in models only"),
    (["--image-size", "64", "--seq-len", "8"], "--image-size, --seq-len apply to built-in models only"),
    (["--weak", "--batch-arg=--batch-size"], "--weak keeps the script's own per-rank batch"),
])
def test_bad_input_is_one_line_before_any_launch(tmp_path: Path, capsys, args: list[str],  # noqa: ANN001
                                                 message: str) -> None:
    script = _script(tmp_path, "train.py", DDP_SCRIPT)
    code = run_cli(["scale", *args, "-o", str(tmp_path / "runs"), "--", "python", script])
    err = " ".join(capsys.readouterr().err.split())
    assert code != 0 and message in err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # no Run: nothing started


def test_a_missing_script_is_one_line_before_any_run(tmp_path: Path) -> None:
    with pytest.raises(ProfileDNNError, match="script not found"):
        scale_script(["python", str(tmp_path / "missing.py")], 2, runs_dir=tmp_path / "runs")
    assert not (tmp_path / "runs").exists()


def test_a_layout_that_fails_leaves_the_others_in_the_table(tmp_path: Path) -> None:
    script = _script(tmp_path, "dies.py", RANK_ONE_RAISES)
    result = scale_script(["python", script], 2, ranks=[1, 2], threads=[1], steps=3, warmup=1,
                          runs_dir=tmp_path / "runs")
    assert result.table["ranks"].to_list() == [1]
    failed = [n for n in result.notes if n.startswith("2 ranks x 1 threads: not measured")]
    assert len(failed) == 1 and "rank 1: the script raised ValueError: rank one cannot go on" in failed[0]
    run = load_run(result.run.path)
    assert run.manifest["status"] == "complete" and run.table(SCALE).height == 1

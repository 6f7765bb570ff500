"""Training frameworks that start their own ranks, under ``optimize`` and ``scale``:
Lightning's ``strategy="ddp"`` re-runs the script for its other ranks when no launcher
started it (a single-process ``optimize`` refuses such a script, naming the launch to use),
takes its ranks from torchrun's variables under ProfileDNN's launch (no process of its
own, one model across the ranks), and refuses a launch whose size is not its
``devices``: the rank's reason then says which launch runs it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from ddp_scripts import spawns_its_own_rank, write_script

from profilednn.capture.own_ranks import own_ranks_note, started_own_ranks
from profilednn.distributed.script_arms import LaunchedArms
from profilednn.distributed.script_hints import launch_hint
from profilednn.distributed.script_scale import trained_alone, why_failed
from profilednn.optimization.script.inject import Injector
from profilednn.optimization.script.runner import StartedOwnRanks, arm_output, own_ranks, run_arm_process
from profilednn.run import load_run

from processes import gone_within

LIGHTNING_DDP = textwrap.dedent("""
    import torch
    from pytorch_lightning import Trainer
    from pytorch_lightning.demos.boring_classes import BoringModel

    if __name__ == "__main__":
        trainer = Trainer(max_epochs=1, accelerator="cpu", devices=2, strategy="ddp", logger=False,
                          enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(BoringModel())
""")
LIGHTNING_REFUSES = ("ValueError: You set `devices=2` and `num_nodes=1` in Lightning, but the product (2 * 1) does "
                     "not match the world size (1).")


def _window(facts: dict) -> dict:
    return {"status": "window", "steps_done": 3, "losses": [1.0, 0.9, 0.8], "times_ms": [5.0, 5.0],
            "first_step_ms": 9.0, "facts": facts}


def test_a_process_group_bigger_than_the_launch_is_the_scripts_own_ranks() -> None:
    assert own_ranks({"world_size": None, "launched_world_size": None}) is None  # no process group
    assert own_ranks({"world_size": 2, "launched_world_size": 2}) is None  # the launch's ranks
    assert own_ranks({"world_size": 1}) is None
    with pytest.raises(StartedOwnRanks, match=r"process group has 2 ranks, but it was started as one process.*"
                                              r"--nproc-per-node 2"):
        arm_output(_window({"world_size": 2, "launched_world_size": None}), window=3)
    assert "one of 2 ranks" in (own_ranks({"world_size": 4, "launched_world_size": 2}) or "")
    assert arm_output(_window({"world_size": 2, "launched_world_size": 2}), window=3).losses == [1.0, 0.9, 0.8]
    assert started_own_ranks(2, None) and not started_own_ranks(None, None) and not started_own_ranks(2, 2)
    assert own_ranks_note(None) is None  # no process group in this process


def test_lightnings_world_size_check_says_which_launch_runs_the_script(tmp_path: Path) -> None:
    hint = launch_hint(LIGHTNING_REFUSES) or ""
    assert "runs only on a launch of 2 rank(s), not 1" in hint and "scale --ranks 2" in hint
    assert "optimize --nproc-per-node 2" in hint and "LOCAL_WORLD_SIZE" in hint
    assert "is 1" in (launch_hint(LIGHTNING_REFUSES.replace("devices=2", "devices=1").replace("(2 * 1)", "(1 * 1)")
                                  .replace("size (1)", "size (2)")) or "")
    assert launch_hint("RuntimeError: Connection closed by peer") is None
    (tmp_path / "result.rank0.json").write_text(json.dumps({"status": "error", "error": LIGHTNING_REFUSES,
                                                            "steps_done": 0}))
    reason = why_failed(tmp_path, 1) or ""
    assert reason.startswith("rank 0: the script raised ValueError: You set `devices=2`")
    assert "Launch it on 2 rank(s) per node" in reason


@pytest.mark.slow
def test_a_single_process_arm_refuses_a_script_that_starts_its_own_ranks(tmp_path: Path) -> None:
    pid_file = tmp_path / "rank1.pid"
    script = write_script(tmp_path, "spawns.py", spawns_its_own_rank(pid_file))
    with pytest.raises(StartedOwnRanks, match="--nproc-per-node 2"):
        run_arm_process({"argv": ["python", script], "warmup": 1, "steps": 2, "seed": 0}, {}, timeout_s=120)
    child = int(pid_file.read_text())
    if not gone_within(child, 30):  # its peer left at the window's end: its next allreduce fails
        os.kill(child, signal.SIGKILL)
        pytest.fail("the rank the script started was left running")


@pytest.mark.slow
def test_profile_keeps_its_run_of_a_script_that_starts_its_own_ranks_and_says_so(tmp_path: Path) -> None:
    pid_file = tmp_path / "rank1.pid"
    script = write_script(tmp_path, "spawns.py", spawns_its_own_rank(pid_file))
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT")}
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
    done = subprocess.run([sys.executable, "-m", "profilednn", "profile", "-o", str(tmp_path / "runs"), "--", "python",
                           script], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    run = load_run(next((tmp_path / "runs").iterdir()))
    notes = " ".join(run.manifest.get("notes") or [])
    assert "process group has 2 ranks, but it was started as one process" in notes
    assert "this Run profiles this process only" in notes and "--nproc-per-node 2" in notes
    assert gone_within(int(pid_file.read_text()), 30)  # the script's rank 1 trained to its end with rank 0


@pytest.mark.slow
def test_lightning_ddp_under_the_launch_trains_one_model_without_spawning(tmp_path: Path) -> None:
    pytest.importorskip("pytorch_lightning")
    script = write_script(tmp_path, "boring.py", LIGHTNING_DDP)
    out = LaunchedArms(2, 1)({"argv": ["python", script], "warmup": 1, "steps": 2, "seed": 0}, {}, timeout_s=300)
    assert out.facts["world_size"] == 2 and out.facts["launched_world_size"] == 2  # torchrun's ranks, no more
    assert [m["world_size"] for m in out.facts["ddp"]] == [2]  # Lightning's own DistributedDataParallel
    assert len(out.losses) == 3 and len(out.times_ms) == 2  # the closure's loss, each step ended at step()
    assert out.facts["frameworks"] == ["Lightning"]


def test_a_lightning_script_whose_ranks_trained_alone_is_told_its_trainer_settings() -> None:
    alone = [{"facts": {"world_size": None, "frameworks": ["Lightning"]}}] * 2
    reason = trained_alone(alone) or ""
    assert "each rank trained alone" in reason  # the verdict, as for any script
    assert 'Trainer(accelerator="cpu", strategy="ddp", devices=2)' in reason and "init_method" not in reason
    assert "init_method env://" in (trained_alone([{"facts": {"world_size": None}}] * 2) or "")


def test_the_batch_of_a_root_called_with_keywords_only_is_read_at_its_next_call() -> None:
    class Keywords(torch.nn.Module):  # a Hugging Face model's call: model(**batch)
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 2)

        def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.cross_entropy(self.layer(input_ids), labels)

    model, injector = Keywords(), Injector([])
    injector.install()
    try:
        for _ in range(3):
            model(input_ids=torch.randn(6, 4), labels=torch.zeros(6, dtype=torch.long)).backward()
    finally:
        injector.remove()
    assert [root.batch for root in injector.facts.roots] == [6]
    assert not model._forward_pre_hooks  # the hook removed itself

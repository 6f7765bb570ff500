"""A user's DDP script over several nodes: ``optimize`` / ``scale`` / ``apply`` with
``--nnodes`` on node rank 0 and ``profilednn follow`` on the others, here two "nodes" on
loopback (a follower subprocess and the verb itself); a follower that is missing or gone
fails with a line naming its node, and bad node options are one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from ddp_scripts import DDP_BATCH_SCRIPT, RANK_ONE_RAISES, write_script

from profilednn.cli import run_cli
from profilednn.distributed.control import hosting
from profilednn.distributed.node_settings import Nodes, nodes_of
from profilednn.distributed.preflight import free_port
from profilednn.distributed.script_arms import LaunchedArms
from profilednn.errors import InputError
from profilednn.optimization.script.runner import ArmError
from profilednn.run import load_run
from profilednn.tables import SCALE


def _follower(port: int, timeout: float = 60) -> subprocess.Popen:
    """``profilednn follow`` as node 1 of 2 on loopback."""
    return subprocess.Popen([sys.executable, "-m", "profilednn", "follow", "--nnodes", "2", "--node-rank", "1",
                             "--master-addr", "127.0.0.1", "--master-port", str(port), "--node-timeout", str(timeout)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _ended(follower: subprocess.Popen) -> tuple[int, str]:
    """The follower's exit code and output (killed with its process group if it has not ended)."""
    try:
        out, err = follower.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(follower.pid, signal.SIGKILL)
        out, err = follower.communicate()
    return follower.returncode, out + err


def _nodes(port: int) -> list[str]:
    return ["--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", str(port), "--node-timeout", "60"]


# --------------------------------------------------------------------------- bad input, one line
@pytest.mark.parametrize("nodes, verb, said", [
    (Nodes(2), "optimize", "needs --master-addr"),
    (Nodes(2, 2, "127.0.0.1"), "scale", r"--node-rank must be in \[0, 1\]"),
    (Nodes(2, 0, "127.0.0.1"), "follow", "runs on the nodes of rank 1 and up"),
    (Nodes(2, 1, "127.0.0.1"), "optimize", "runs on node rank 0.*profilednn follow --nnodes 2 --node-rank 1"),
    (Nodes(2, 0, "127.0.0.1", timeout=0), "scale", "--node-timeout must be > 0"),
])
def test_bad_node_options_are_one_line(nodes: Nodes, verb: str, said: str) -> None:
    with pytest.raises(InputError, match=said):
        nodes.check(verb)


def test_one_node_needs_no_control_store() -> None:
    assert nodes_of(1, 0, None, None, 300.0, "scale") is None


def test_the_verbs_refuse_bad_node_options_before_any_run(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    script = write_script(tmp_path, "train.py", DDP_BATCH_SCRIPT)
    runs = tmp_path / "runs"
    for args, said in [
        (["scale", "--nnodes", "2", "-o", str(runs), "--", "python", script], "needs --master-addr"),
        (["optimize", "--nnodes", "2", "--master-addr", "127.0.0.1", "--model", "small_cnn", "-o", str(runs)],
         "--nnodes and --batch-arg apply to a data-parallel script"),
        (["scale", "--nnodes", "2", "--master-addr", "127.0.0.1", "--model", "small_cnn", "-o", str(runs)],
         "--batch-arg and --nnodes apply to a script"),
        (["optimize", "--nnodes", "2", "--node-rank", "3", "--master-addr", "127.0.0.1", "-o", str(runs), "--",
          "python", script], "--node-rank must be in"),
    ]:
        assert run_cli(args) != 0
        err = " ".join(capsys.readouterr().err.split())
        assert said in err, err
    assert not runs.exists()


# --------------------------------------------------------------------------- two nodes on loopback
def test_optimize_over_two_nodes_judges_every_rank_and_apply_follows(tmp_path: Path, capfd) -> None:  # noqa: ANN001
    from rich.console import Console

    from profilednn.distributed.script_arms import optimize_ddp_script
    from profilednn.optimization.settings import Settings
    from profilednn.optimization.terminal import print_recipes

    script = write_script(tmp_path, "train.py", DDP_BATCH_SCRIPT)
    port = free_port()
    follower = _follower(port)
    # one round: the numerics are judged on the A/B's first runs; what is asserted needs no interval
    settings = Settings.for_script(nproc_per_node=1, nnodes=2, threads=1, rounds=1, child_steps=2, time_budget_s=0,
                                   calibrate_noise=False, final_ab=False, headroom=False, measure_flops=False)
    run, report = optimize_ddp_script(["python", script], tmp_path / "runs", ["fused_optimizer"], settings=settings,
                                      nodes=Nodes(2, 0, "127.0.0.1", port, timeout=60))
    returncode, said = _ended(follower)
    assert returncode == 0 and "node rank 0 is done" in said, said[-3000:]
    console = Console(record=True, width=160)
    print_recipes(report, console)
    table = console.export_text()
    assert "fused_optimizer" in table and "numerics" in table  # the recipes table
    assert any("pinned launch of 2 ranks over 2 nodes" in n for n in report.notes)
    assert run.status == "complete"
    assert run.manifest["script"]["nnodes"] == 2 and run.manifest["script"]["facts"]["world_size"] == 2
    row = next(r for r in report.recipes if r.recipe == "fused_optimizer")
    assert row.numerics == "pass" and "each of the 2 ranks' against its own" in row.tolerance, row.decision

    follower = _follower(port)  # apply: node 0's rank here, node 1's launched by its follower
    capfd.readouterr()
    assert run_cli(["apply", str(run.path), *_nodes(port), "--", "python", script]) == 0
    returncode, said = _ended(follower)
    out = capfd.readouterr().out
    assert returncode == 0, said[-3000:]
    assert "trained on rank" in out and "of 2" in out  # node 0's rank of the 2-rank job ran to its end


def test_scale_over_two_nodes_states_each_rows_global_batch(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    script = write_script(tmp_path, "train.py", DDP_BATCH_SCRIPT)
    port = free_port()
    follower = _follower(port)
    code = run_cli(["scale", "--cores", "1", "--ranks", "1", "--threads", "1", "--steps", "2", "--warmup", "1",
                    *_nodes(port), "--wide", "-o", str(tmp_path / "runs"), "--", "python", script, "--batch-size", "4"])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 0, out[-3000:]
    returncode, said = _ended(follower)
    assert returncode == 0, said[-3000:]
    assert "global" in out and "2 nodes: ranks and threads are each node's" in out
    run = load_run(next((tmp_path / "runs").iterdir()))
    rows = run.table(SCALE).to_dicts()
    assert [(r["ranks"], r["global_batch"]) for r in rows] == [(1, 8)]  # 4 on each of 2 ranks, one per node


def test_a_missing_follower_is_one_line_not_a_hang(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    script = write_script(tmp_path, "train.py", DDP_BATCH_SCRIPT)
    port = free_port()
    code = run_cli(["scale", "--cores", "1", "--ranks", "1", "--threads", "1", "--nnodes", "2", "--master-addr",
                    "127.0.0.1", "--master-port", str(port), "--node-timeout", "3", "-o", str(tmp_path / "runs"),
                    "--", "python", script])
    err = " ".join(capsys.readouterr().err.split())
    assert code != 0
    assert f"node 1 did not connect to the control store 127.0.0.1:{port} within --node-timeout 3 s" in err, err
    assert f"profilednn follow --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port {port}" in err


def test_a_follower_gone_fails_the_arm_naming_its_node(tmp_path: Path) -> None:
    script = write_script(tmp_path, "train.py", DDP_BATCH_SCRIPT)
    port = free_port()
    follower = _follower(port)
    nodes = Nodes(2, 0, "127.0.0.1", port, timeout=60)
    with hosting(nodes) as host:  # the follower connected
        os.killpg(follower.pid, signal.SIGKILL)
        follower.wait()
        host.nodes = Nodes(2, 0, "127.0.0.1", port, timeout=3)
        # the node timeout ended it (its message), not the arm's 120 s
        with pytest.raises(ArmError, match="node 1 did not take up arm1 within --node-timeout 3 s"):
            LaunchedArms(1, 1, host=host)({"argv": ["python", script], "warmup": 1, "steps": 2, "seed": 0}, {},
                                          timeout_s=120)


def test_a_rank_that_raises_on_either_node_is_named_with_its_own_error(tmp_path: Path) -> None:
    script = write_script(tmp_path, "dies.py", RANK_ONE_RAISES)
    port = free_port()
    follower = _follower(port)
    with hosting(Nodes(2, 0, "127.0.0.1", port, timeout=60)) as host:
        with pytest.raises(ArmError, match=r"rank 1: the script raised ValueError: rank one cannot go on"):
            LaunchedArms(1, 1, host=host)({"argv": ["python", script], "warmup": 1, "steps": 3, "seed": 0}, {},
                                          timeout_s=120)  # c10d numbers the ranks by arrival: rank 1 on either node
    returncode, said = _ended(follower)
    assert returncode == 0 and "node rank 0 is done" in said, said[-3000:]

"""Launch plans, backends, pre-flight checks and the per-rank wrapper (no torchrun here)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from profilednn.distributed import rank_entry
from profilednn.distributed.backends import BackendStatus, backend_status, choose_backend
from profilednn.distributed.launch import LaunchSettings, check_master, describe_failures, free_port, prepare_launch
from profilednn.distributed.plan import LaunchPlan, PlanError, make_plan, rank_env, rank_thread_grid
from profilednn.errors import InputError
from profilednn.topology import Core, CpuTopology, cpu_topology


def topo(sockets: int, cores_per_socket: int, nodes_per_socket: int = 1, smt: int = 1) -> CpuTopology:
    cores, cpu = [], 0
    total = sockets * cores_per_socket
    for s in range(sockets):
        for c in range(cores_per_socket):
            node = s * nodes_per_socket + c * nodes_per_socket // cores_per_socket
            cores.append(Core(socket=s, core=c, node=node,
                              cpus=tuple(cpu + k * total for k in range(smt))))
            cpu += 1
    return CpuTopology(model_name="synthetic", cores=tuple(cores))


def test_ranks_spread_over_sockets_without_spanning() -> None:
    plan = make_plan(topo(2, 4), 2)
    assert plan.threads_per_rank == 4
    assert [s.sockets for s in plan.ranks] == [(0,), (1,)]
    assert [s.cpus for s in plan.ranks] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    four = make_plan(topo(2, 4), 4, 2)
    assert [s.sockets[0] for s in four.ranks] == [0, 0, 1, 1]
    assert len({c for s in four.ranks for c in s.cpus}) == 8  # no core shared


def test_plan_spreads_inside_a_socket_over_numa_nodes() -> None:
    plan = make_plan(topo(1, 8, nodes_per_socket=2), 2, 2)
    assert [s.numa_nodes for s in plan.ranks] == [(0,), (1,)]
    assert plan.idle_cores == 4 and any("idle" in n for n in plan.notes)


def test_rank_spanning_a_socket_is_refused_unless_allowed() -> None:
    uneven = make_plan(topo(2, 4), 3, 2)  # fits: two ranks on socket 0, one on socket 1
    assert [s.sockets for s in uneven.ranks] == [(0,), (0,), (1,)]
    with pytest.raises(PlanError, match="spanning a socket.*--threads-per-rank <= 3.*--allow-span"):
        make_plan(topo(2, 6), 3, 4)
    with pytest.raises(PlanError, match="spanning"):
        make_plan(topo(2, 4), 1, 8)
    spanned = make_plan(topo(2, 4), 1, 8, allow_span=True)
    assert spanned.ranks[0].spans_socket and any("allow-span" in n for n in spanned.notes)


def test_oversubscribed_plans_fail_with_a_working_suggestion() -> None:
    with pytest.raises(PlanError, match="8 physical cores.*<= 8"):
        make_plan(topo(2, 4), 9)
    with pytest.raises(PlanError, match=r"4 ranks x 4 threads = 16 threads.*<= 2"):
        make_plan(topo(2, 4), 4, 4)
    with pytest.raises(PlanError, match="node-rank"):
        make_plan(topo(2, 4), 1, nnodes=2, node_rank=2)


def test_hyperthreads_left_free_and_plan_round_trips() -> None:
    plan = make_plan(topo(1, 4, smt=2), 2)
    assert [s.cpus for s in plan.ranks] == [(0, 1), (2, 3)]  # first sibling of each core only
    assert any("hyperthread" in n for n in plan.notes)
    assert LaunchPlan.from_dict(json.loads(plan.to_json())) == plan


def test_rank_env_sets_threads_and_affinity() -> None:
    plan = make_plan(topo(2, 4), 2, 3)
    env = rank_env(plan, 1)
    assert env["OMP_NUM_THREADS"] == "3" and env["MKL_NUM_THREADS"] == "3"
    assert env["OMP_PLACES"] == "{4},{5},{6}" and env["OMP_PROC_BIND"] == "close"
    assert not any(k.startswith("KMP_") for k in env)  # Intel OpenMP only: see test_launch_runtime


@pytest.mark.cpu_facing
def test_this_machine_plan() -> None:
    machine = cpu_topology()
    plan = make_plan(machine, machine.physical_cores)
    assert plan.threads_per_rank == 1
    assert len({s.cpus for s in plan.ranks}) == machine.physical_cores


def test_rank_thread_grid_fits_the_cores() -> None:
    grid = rank_thread_grid(8)
    assert (1, 8) in grid and (8, 1) in grid and (2, 4) in grid
    assert all(r * t <= 8 for r, t in grid)
    assert rank_thread_grid(6, [1, 2], [3]) == [(1, 3), (2, 3)]


def test_backend_detection_and_fallback() -> None:
    status = {s.name: s for s in backend_status()}
    assert status["gloo"].available
    assert set(status) == {"gloo", "mpi", "ccl"}
    missing = [BackendStatus("gloo", True, ""), BackendStatus("mpi", False, "no mpirun"),
               BackendStatus("ccl", False, "not installed")]
    assert choose_backend("auto", missing).name == "gloo"
    fallback = choose_backend("ccl", missing)
    assert fallback.name == "gloo" and "ccl is not available (not installed)" in fallback.note
    present = [BackendStatus("gloo", True, ""), BackendStatus("mpi", True, "mpirun"), BackendStatus("ccl", True, "")]
    assert choose_backend("ccl", present).name == "ccl"
    assert choose_backend("mpi", present).name == "mpi"
    with pytest.raises(InputError):
        choose_backend("nccl", present)


def test_prepare_launch_builds_torchrun_call(tmp_path: Path) -> None:
    settings = LaunchSettings(nproc_per_node=2, threads_per_rank=1, max_restarts=3, backend="ccl", job_id="j1")
    prepared = prepare_launch(["python", "train.py", "--lr", "1"], settings, check=False, topology=topo(1, 2))
    argv = prepared.launcher_argv
    assert argv[argv.index("--rdzv-backend") + 1] == "c10d"
    assert argv[argv.index("--max-restarts") + 1] == "3"
    assert "is_host=true" in argv[argv.index("--rdzv-conf") + 1]
    assert argv[-3:] == ["train.py", "--lr", "1"]
    assert prepared.env["OMP_NUM_THREADS"] == "1" and prepared.env["PROFILEDNN_DIST_BACKEND"] == prepared.backend.name
    if prepared.backend.name == "gloo":  # oneCCL is not installed here: noted fallback
        assert any("ccl is not available" in n for n in prepared.notes)
    plan_data = json.loads(prepared.plan_file.read_text())
    assert plan_data["env"][1]["OMP_PLACES"] == "{1}"
    prepared.discard()
    with pytest.raises(InputError, match="after `--`"):
        prepare_launch([], LaunchSettings(nproc_per_node=1), check=False, topology=topo(1, 2))
    with pytest.raises(PlanError, match="--master-addr"):
        prepare_launch(["x"], LaunchSettings(nproc_per_node=1, nnodes=2, node_rank=1), check=False,
                       topology=topo(1, 2))


def test_mpi_backend_is_started_by_mpirun_when_installed() -> None:
    present = [BackendStatus("gloo", True, ""), BackendStatus("mpi", True, "mpirun"), BackendStatus("ccl", False, "")]
    prepared = prepare_launch(["python", "train.py"], LaunchSettings(nproc_per_node=2, backend="mpi", job_id="m"),
                              check=False, topology=topo(1, 2), backends=present)
    assert prepared.launcher == "mpirun"
    argv = prepared.launcher_argv
    assert argv[:3] == ["mpirun", "-np", "2"] and argv[-2:] == ["python", "train.py"]
    assert rank_entry.__file__.endswith(Path(argv[-3]).name)
    prepared.discard()
    assert not prepared.plan_file.exists()


def test_master_checks_fail_before_start() -> None:
    with pytest.raises(PlanError, match="does not resolve"):
        check_master("no-such-host.invalid", 29500, 1, connect_timeout=1)
    with pytest.raises(PlanError, match="must be an address of this machine"):
        check_master("192.0.2.1", free_port(), 0)  # TEST-NET-1: never local
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        with pytest.raises(PlanError, match="already in use"):
            check_master("127.0.0.1", port, 0)
        check_master("127.0.0.1", port, 1, connect_timeout=1)  # reachable: no error
    with pytest.raises(PlanError, match="cannot reach the master 127.0.0.1"):
        check_master("127.0.0.1", free_port(), 1, connect_timeout=1)


def test_describe_failures_names_the_first_failed_rank() -> None:
    text = describe_failures({"kind": "rank", "failures": [
        {"rank": 0, "local_rank": 0, "pid": 10, "exitcode": -15, "signal": "SIGTERM", "first": False},
        {"rank": 3, "local_rank": 1, "pid": 11, "exitcode": 13, "signal": None, "first": True},
    ]})
    assert text.startswith("rank 3 (local rank 1, pid 11) exited with code 13 (first failure; then rank 0")
    assert "SIGTERM" in text
    assert "rendezvous" in describe_failures({"kind": "agent", "error": "RendezvousTimeoutError: rendezvous"})


def test_a_peers_error_exit_right_after_a_rank_died_does_not_hide_it() -> None:
    """Rank 1 killed; rank 0's gloo read fails ("connection reset by peer") and, ending
    without native teardown, reaches the agent first: the killed rank is the root cause."""
    failures = [{"rank": 0, "local_rank": 0, "pid": 10, "exitcode": 1, "signal": None, "timestamp": 100, "first": True},
                {"rank": 1, "local_rank": 1, "pid": 11, "exitcode": -9, "signal": "SIGKILL", "timestamp": 101,
                 "first": False}]
    text = describe_failures({"kind": "rank", "failures": failures})
    assert text.startswith("rank 1 (local rank 1, pid 11) was killed by SIGKILL (first failure; then rank 0")
    failures[1]["timestamp"] = 110  # long after: unrelated, the error exit stays first
    assert describe_failures({"kind": "rank", "failures": failures}).startswith("rank 0 (local rank 0, pid 10)")


def test_rank_entry_pins_and_execs(tmp_path: Path) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    plan = {"ranks": [{"cpus": [cpus[0]]}, {"cpus": [cpus[-1]]}],
            "env": [{"OMP_NUM_THREADS": "1"}, {"OMP_NUM_THREADS": "7"}]}
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan))
    env = dict(os.environ, **{rank_entry.PLAN_ENV: str(plan_file), "LOCAL_RANK": "1"})
    out = subprocess.run([sys.executable, rank_entry.__file__, "python", "-c",
                          "import os, sys; print(sorted(os.sched_getaffinity(0)), os.environ['OMP_NUM_THREADS'], "
                          "sys.executable)"],
                         env=env, capture_output=True, text=True, timeout=60, check=True).stdout.split()
    assert out[0] == f"[{cpus[-1]}]" and out[1] == "7"
    assert out[2] == sys.executable  # a bare `python` runs this interpreter
    env["LOCAL_RANK"] = "5"
    bad = subprocess.run([sys.executable, rank_entry.__file__, "python", "-c", "print(1)"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "outside the plan" in bad.stderr

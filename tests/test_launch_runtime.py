"""The launcher without launching: run_cpu-style rank settings on injected machines, the printed
command's quoting, per-rank line relaying, rank_entry's redirect and prefix, plan-dir cleanup."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from profilednn.cli import run_cli
from profilednn.distributed import rank_entry
from profilednn.distributed.launch import LaunchSettings, job_dir_of, prepare_launch
from profilednn.distributed.plan import make_plan
from profilednn.distributed.rank_output import RankOutput, log_file_name, parse_ranks
from profilednn.distributed.rank_runtime import (
    JEMALLOC_CONF, RuntimeProbe, detect_openmp, find_library, rank_runtime,
)
from profilednn.errors import InputError
from profilednn.topology import Core, CpuTopology


def topo(sockets: int, cores_per_socket: int, nodes_per_socket: int = 1) -> CpuTopology:
    cores = []
    for s in range(sockets):
        for c in range(cores_per_socket):
            node = s * nodes_per_socket + c * nodes_per_socket // cores_per_socket
            cores.append(Core(socket=s, core=c, node=node, cpus=(s * cores_per_socket + c,)))
    return CpuTopology(model_name="synthetic", cores=tuple(cores))


TWO_NODES = make_plan(topo(2, 4), 2, 2)  # rank 0 on NUMA node 0, rank 1 on node 1
JE = "/opt/lib/libjemalloc.so.2"
TC = "/opt/lib/libtcmalloc.so.4"


# --------------------------------------------------------------------------- run_cpu parity
def test_jemalloc_preloaded_with_run_cpus_malloc_conf_and_user_values_kept() -> None:
    probe = RuntimeProbe(libraries={"jemalloc": JE}, openmp="gnu")
    rt = rank_runtime(TWO_NODES, probe, {"LD_PRELOAD": "/my/libfoo.so"})
    assert rt.env[0]["LD_PRELOAD"] == f"{JE}:/my/libfoo.so"  # prepended, the user's stays
    assert rt.env[1]["MALLOC_CONF"] == JEMALLOC_CONF
    mine = rank_runtime(TWO_NODES, probe, {"MALLOC_CONF": "narenas:2"})
    assert "MALLOC_CONF" not in mine.env[0]  # rank_entry leaves the inherited value alone
    assert any("MALLOC_CONF=narenas:2 (yours, kept" in s for s in mine.settings)


def test_tcmalloc_first_an_allocator_already_preloaded_wins_and_missing_is_noted() -> None:
    both = RuntimeProbe(libraries={"jemalloc": JE, "tcmalloc": TC})
    rt = rank_runtime(TWO_NODES, both, {})
    assert rt.env[0]["LD_PRELOAD"] == TC and "MALLOC_CONF" not in rt.env[0]
    assert rank_runtime(TWO_NODES, both, {}, allocator="jemalloc").env[0]["LD_PRELOAD"] == JE
    preloaded = rank_runtime(TWO_NODES, both, {"LD_PRELOAD": "/x/libjemalloc.so"})
    assert "LD_PRELOAD" not in preloaded.env[0]
    system = rank_runtime(TWO_NODES, both, {}, allocator="system")
    assert "LD_PRELOAD" not in system.env[0] and not any("malloc" in n for n in system.notes)
    none = rank_runtime(TWO_NODES, RuntimeProbe(), {})
    assert "LD_PRELOAD" not in none.env[0]
    assert any("tcmalloc or jemalloc is not installed" in n for n in none.notes)
    with pytest.raises(InputError, match="--allocator"):
        rank_runtime(TWO_NODES, both, {}, allocator="mimalloc")


def test_kmp_variables_only_with_intel_openmp_and_never_over_the_users() -> None:
    intel = rank_runtime(TWO_NODES, RuntimeProbe(openmp="intel"), {})
    assert intel.env[0]["KMP_BLOCKTIME"] == "1"
    assert intel.env[1]["KMP_AFFINITY"] == "granularity=fine,explicit,proclist=[4,5]"
    gnu = rank_runtime(TWO_NODES, RuntimeProbe(openmp="gnu"), {})
    assert not any(k.startswith("KMP_") for k in gnu.env[0])
    assert any("GNU libgomp" in s for s in gnu.settings)
    mine = rank_runtime(TWO_NODES, RuntimeProbe(openmp="intel"),
                        {"KMP_BLOCKTIME": "200", "KMP_AFFINITY": "compact", "OMP_PROC_BIND": "spread",
                         "OMP_NUM_THREADS": "8"})
    assert "KMP_BLOCKTIME" not in mine.env[0] and "KMP_AFFINITY" not in mine.env[0]
    assert "OMP_PROC_BIND" not in mine.env[0]  # the user's binding policy stays
    assert mine.env[0]["OMP_NUM_THREADS"] == "2"  # the thread count follows --threads-per-rank ...
    assert any("OMP_NUM_THREADS=8 in your environment is replaced" in n for n in mine.notes)  # ... said so


def test_numactl_membind_per_rank_node_or_a_clear_note() -> None:
    bound = rank_runtime(TWO_NODES, RuntimeProbe(numactl="/usr/bin/numactl"), {})
    assert bound.prefix == (("/usr/bin/numactl", "--membind=0", "--"), ("/usr/bin/numactl", "--membind=1", "--"))
    assert bound.memory(1) == "numactl --membind=1"
    missing = rank_runtime(TWO_NODES, RuntimeProbe(numactl_detail="numactl is not installed"), {})
    assert missing.prefix == ((), ()) and missing.memory(0) == "first touch"
    assert any("numactl is not installed" in n and "not bound to its NUMA node" in n for n in missing.notes)
    one_node = rank_runtime(make_plan(topo(1, 4), 2, 2), RuntimeProbe(numactl="/usr/bin/numactl"), {})
    assert one_node.prefix == ((), ()) and not any("numactl" in n for n in one_node.notes)
    off = rank_runtime(TWO_NODES, RuntimeProbe(numactl="/usr/bin/numactl"), {}, membind=False)
    assert off.prefix == ((), ()) and any("--no-membind" in s for s in off.settings)


def test_openmp_and_library_detection(tmp_path: Path) -> None:
    assert detect_openmp({}, ["libgomp-a34b3233.so.1", "libtorch_cpu.so"]) == "gnu"
    assert detect_openmp({}, ["libiomp5.so", "libtorch_cpu.so"]) == "intel"
    assert detect_openmp({"LD_PRELOAD": "/opt/intel/libiomp5.so"}, ["libgomp.so.1"]) == "intel"
    assert detect_openmp({}, ["libtorch_cpu.so"]) == "unknown"
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libjemalloc.so.2").write_bytes(b"")
    assert find_library("jemalloc", {"VIRTUAL_ENV": str(tmp_path)}) == str(lib / "libjemalloc.so.2")


def test_plan_file_and_dry_run_show_the_settings(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # where the plan directories go
    probe = RuntimeProbe(numactl="/usr/bin/numactl", libraries={"jemalloc": JE}, openmp="intel")
    settings = LaunchSettings(nproc_per_node=2, threads_per_rank=2, job_id="j1", runs_dir=tmp_path / "runs")
    prepared = prepare_launch(["python", "train.py"], settings, check=False, topology=topo(2, 4), probe=probe)
    try:
        data = json.loads(prepared.plan_file.read_text())
        assert data["prefix"][1] == ["/usr/bin/numactl", "--membind=1", "--"]
        assert data["env"][0]["LD_PRELOAD"].startswith(JE) and data["env"][0]["KMP_BLOCKTIME"] == "1"
        assert data["log_dir"] == str((tmp_path / "runs" / "j1" / "logs").absolute())
        assert not (tmp_path / "runs").exists()  # nothing written before the job starts
    finally:
        prepared.discard()
    assert not prepared.plan_file.parent.exists()

    code = run_cli(["launch", "--nproc-per-node", "1", "--threads-per-rank", "1", "--dry-run", "-o",
                    str(tmp_path / "runs"), "--job-id", "dry", "--", "python", "-c", "print('[red]x[/]')"])
    out = capsys.readouterr().out
    assert code == 0
    assert "memory" in out and "KMP_AFFINITY" in out and "allocator" in out
    assert "[red]x[/]" in out  # user text printed verbatim, not read as markup
    assert f"per-rank logs in {(tmp_path / 'runs' / 'dry' / 'logs').absolute()}" in " ".join(out.split())
    assert list(temp.iterdir()) == []  # --dry-run removed its plan directory


def test_printed_command_is_shell_quoted_and_runs_nothing_injected(tmp_path: Path) -> None:
    evil = ["python", "-c", "print(1); open('x1', 'w')", "$(touch x2)", "`touch x3`", "a'b\"c", "; touch x4",
            "| touch x5", "&& touch x6", "*", "new\nline"]
    prepared = prepare_launch(evil, LaunchSettings(nproc_per_node=1, threads_per_rank=1, job_id="q"), check=False,
                              topology=topo(1, 2), probe=RuntimeProbe())
    prepared.discard()
    line = prepared.torchrun_command()
    assert line.startswith("torchrun ")
    script = "torchrun() { printf '%s\\0' \"$@\"; }\n" + line + "\n"
    res = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, timeout=30, check=True)
    assert res.stdout.decode().split("\0")[:-1] == prepared.launcher_argv  # the same arguments back
    assert list(tmp_path.iterdir()) == []  # and nothing ran


def test_store_shared_with_the_agent_unless_restarts_need_a_fresh_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", raising=False)
    flag = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
    for restarts, want in ((0, None), (2, "1")):
        settings = LaunchSettings(nproc_per_node=1, threads_per_rank=1, max_restarts=restarts)
        prepared = prepare_launch(["python", "x.py"], settings, check=False, topology=topo(1, 2), probe=RuntimeProbe())
        prepared.discard()
        assert prepared.env.get(flag) == want


def test_job_dir_follows_a_train_commands_own_runs_dir_and_job_id() -> None:
    train = ["python", "-m", "profilednn", "train", "--steps", "2", "-o", "out/r", "--job-id", "mine"]
    assert job_dir_of(train, "launch-id") == Path("out/r/mine")
    assert job_dir_of(["profilednn", "train", "--runs-dir=elsewhere"], "j") == Path("elsewhere/j")
    assert job_dir_of(["python", "train.py", "-o", "x"], "j") == Path("runs/j")  # not ours: not read
    assert job_dir_of(train, "j", runs_dir=Path("given")) == Path("given/mine")


# --------------------------------------------------------------------------- per-rank output
class _Sink:
    def __init__(self) -> None:
        self.text = ""

    def write(self, s: str) -> int:
        self.text += s
        return len(s)

    def flush(self) -> None:
        pass


def test_rank_output_relays_whole_tagged_lines_and_filters(tmp_path: Path) -> None:
    (tmp_path / log_file_name(1, "stdout")).write_bytes(b"old line from an earlier job\n")
    out, err = _Sink(), _Sink()
    relay = RankOutput(tmp_path, stdout=out, stderr=err)
    relay.__enter__()
    relay.close()  # stop the thread: the test drives poll() itself, deterministically
    r0, r1 = tmp_path / log_file_name(0, "stdout"), tmp_path / log_file_name(1, "stdout")
    with open(r0, "ab") as f0, open(r1, "ab") as f1:
        f0.write(b"rank 0/2 in_sync")  # a print's first write ...
        f0.flush()
        f1.write(b"rank 1/2 in_sync True\nrank 1 half")
        f1.flush()
        relay.poll()
        assert out.text == "[rank1]: rank 1/2 in_sync True\n"  # only complete lines; old content skipped
        f0.write(b" True\n")  # ... and its second
        f0.flush()
        relay.poll()
    (tmp_path / log_file_name(0, "stderr", attempt=1)).write_text("warn\n[rank0]: Traceback (torch's tag)\n")
    relay.poll(final=True)
    assert out.text.splitlines() == ["[rank1]: rank 1/2 in_sync True", "[rank0]: rank 0/2 in_sync True",
                                     "[rank1]: rank 1 half"]
    assert err.text == "[rank0]: warn\n[rank0]: Traceback (torch's tag)\n"  # not tagged twice

    only0 = _Sink()
    filtered = RankOutput(tmp_path, stdout=only0, stderr=only0, ranks=parse_ranks("0"), prefix=False)
    filtered.poll(final=True)
    assert only0.text.splitlines() == ["warn", "[rank0]: Traceback (torch's tag)", "rank 0/2 in_sync True"]
    assert parse_ranks("all") is None and parse_ranks("0,1") == {0, 1}
    with pytest.raises(InputError, match="--ranks"):
        parse_ranks("zero")


def test_rank_entry_redirects_to_rank_logs_and_runs_the_prefix(tmp_path: Path) -> None:
    env_bin = shutil.which("env")
    assert env_bin is not None
    plan = {"ranks": [{"cpus": [sorted(os.sched_getaffinity(0))[0]]}], "env": [{"OMP_NUM_THREADS": "1"}],
            "prefix": [[env_bin, "PREFIX_RAN=yes"]], "log_dir": str(tmp_path)}
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan))
    env = dict(os.environ, **{rank_entry.PLAN_ENV: str(plan_file), "LOCAL_RANK": "0", "RANK": "3",
                              "TORCHELASTIC_RESTART_COUNT": "1"})
    res = subprocess.run([sys.executable, rank_entry.__file__, "python", "-c",
                          "import os, sys; print(os.environ['PREFIX_RAN']); print('oops', file=sys.stderr)"],
                         env=env, capture_output=True, text=True, timeout=60, check=True)
    assert res.stdout == "" and res.stderr == ""  # everything went to the rank's files
    assert (tmp_path / "rank3.attempt1.stdout.log").read_text() == "yes\n"
    assert (tmp_path / "rank3.attempt1.stderr.log").read_text() == "oops\n"

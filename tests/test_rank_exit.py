"""rank_entry's clean exit, with real rank processes (no torch, no launcher): a rank whose
script finished ends with the script's own exit code after its atexit handlers and flushes,
without the native teardown that aborts when a native thread is still joinable; a script
that raises or is killed still fails; the exit records feed the launcher's summary."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from profilednn.distributed import rank_entry
from profilednn.distributed.launch import clean_exit_note, rank_exits

ABORT = "terminate called without an active exception"
# A C++ std::thread kept joinable in a static: its destructor runs in the process's native
# teardown (exit()) and calls std::terminate, every time; the shape of Gloo's loop threads.
JOINABLE_CC = r"""
#include <chrono>
#include <pthread.h>
#include <thread>
static std::thread worker;
extern "C" void start_worker() {
  worker = std::thread([] { for (;;) std::this_thread::sleep_for(std::chrono::seconds(1)); });
  pthread_setname_np(worker.native_handle(), "joinable_loop");
}
"""


def _plan(tmp: Path, prefix: list[str] | None = None) -> Path:
    plan = {"ranks": [{"cpus": [sorted(os.sched_getaffinity(0))[0]]}], "env": [{"OMP_NUM_THREADS": "1"}],
            "prefix": [prefix or []], "log_dir": None}
    path = tmp / "plan" / "plan.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(plan))
    return path


def rank(tmp: Path, *command: str, prefix: list[str] | None = None, rank_id: int = 0,
         unbuffered: bool = True) -> subprocess.CompletedProcess:
    """Run ``command`` as rank ``rank_id`` through rank_entry, in ``tmp``."""
    env = dict(os.environ, **{rank_entry.PLAN_ENV: str(_plan(tmp, prefix)), "LOCAL_RANK": "0",
                              "RANK": str(rank_id)})
    env.pop("TORCHELASTIC_RESTART_COUNT", None)
    if not unbuffered:
        env.pop("PYTHONUNBUFFERED", None)
    return subprocess.run([sys.executable, rank_entry.__file__, *command], env=env, cwd=tmp,
                          capture_output=True, text=True, timeout=60, check=False)


def exit_record(tmp: Path, rank_id: int = 0) -> dict | None:
    path = tmp / "plan" / rank_entry.EXITS_DIR / f"rank{rank_id}.json"
    return json.loads(path.read_text()) if path.exists() else None


def script(tmp: Path, text: str, name: str = "job.py") -> str:
    (tmp / name).write_text(text)
    return name


@pytest.fixture(scope="module")
def joinable_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler to build the joinable-thread library")
    out = tmp_path_factory.mktemp("native")
    (out / "joinable.cc").write_text(JOINABLE_CC)
    subprocess.run([cxx, "-shared", "-fPIC", "-pthread", str(out / "joinable.cc"), "-o", str(out / "libj.so")],
                   check=True, capture_output=True, timeout=120)
    return out / "libj.so"


def test_finished_rank_with_a_joinable_native_thread_exits_0(tmp_path: Path, joinable_lib: Path) -> None:
    job = script(tmp_path, f"import ctypes\nctypes.CDLL({str(joinable_lib)!r}).start_worker()\nprint('all done')\n")
    plain = subprocess.run([sys.executable, job], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert plain.returncode == -signal.SIGABRT and ABORT in plain.stderr  # the abort reproduces without it
    res = rank(tmp_path, "python", job)
    assert (res.returncode, res.stdout, res.stderr) == (0, "all done\n", "")
    record = exit_record(tmp_path)
    assert record is not None and record["exit_code"] == 0 and record["ended"] == "returned"
    assert record["native_threads"] == ["joinable_loop"]  # what native teardown would have met


def test_script_that_raises_fails_with_its_traceback_after_which_atexit_runs(tmp_path: Path) -> None:
    job = script(tmp_path, "import atexit\natexit.register(print, 'atexit ran')\n"
                           "def train():\n    raise ValueError('bad batch')\ntrain()\n")
    res = rank(tmp_path, "python", job)
    assert res.returncode == 1 and res.stdout == "atexit ran\n"
    lines = res.stderr.splitlines()
    assert lines[0] == "Traceback (most recent call last):" and lines[-1] == "ValueError: bad batch"
    assert f'File "{tmp_path / job}", line 5, in <module>' in res.stderr and "line 4, in train" in res.stderr
    assert "rank_entry" not in res.stderr  # the traceback Python prints, without the wrapper's frames
    assert exit_record(tmp_path)["ended"] == "raised"


def test_atexit_handlers_open_files_and_c_stdio_finish_before_the_exit(tmp_path: Path) -> None:
    job = script(tmp_path, """
import atexit, ctypes, pickle
class Checkpoint:
    pass
log = open("train.log", "w")  # never closed: a normal exit flushes it
log.write("step 7\\n")
ctypes.CDLL(None).printf(b"native line\\n")  # C stdio, buffered when stdout is not a terminal
def save():
    open("ckpt.pkl", "wb").write(pickle.dumps(Checkpoint()))  # by reference: __main__.Checkpoint
    print("checkpoint written")
atexit.register(save)
print("trained")
""")
    res = rank(tmp_path, "python", job, unbuffered=False)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["trained", "checkpoint written", "native line"]
    assert (tmp_path / "train.log").read_text() == "step 7\n"
    assert b"Checkpoint" in (tmp_path / "ckpt.pkl").read_bytes()


@pytest.mark.parametrize(("body", "code", "stderr", "ended"), [
    ("import sys; sys.exit(3)", 3, "", "sys.exit"),
    ("import sys; sys.exit('no data found')", 1, "no data found\n", "sys.exit"),
    ("import sys; sys.exit(None)", 0, "", "sys.exit"),
    ("x = 1", 0, "", "returned"),
])
def test_exit_code_is_the_scripts_own(tmp_path: Path, body: str, code: int, stderr: str, ended: str) -> None:
    res = rank(tmp_path, "python", script(tmp_path, body), rank_id=2)
    assert (res.returncode, res.stderr) == (code, stderr)
    assert exit_record(tmp_path, 2) | {"pid": 0} == {"rank": 2, "attempt": 0, "pid": 0, "exit_code": code,
                                                     "ended": ended, "native_threads": []}


def test_a_rank_killed_by_a_signal_still_fails_and_records_no_clean_exit(tmp_path: Path) -> None:
    res = rank(tmp_path, "python", "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert res.returncode == -signal.SIGKILL
    assert exit_record(tmp_path) is None


PROBE = "import sys; print(__name__, sys.argv, sys.path[0], any(p.endswith('distributed') for p in sys.path))"


def test_every_python_form_runs_as_main_with_pythons_argv_and_path(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "__main__.py").write_text(PROBE + "; sys.exit(4)")
    job = script(tmp_path, PROBE)
    tool = tmp_path / "tool"
    tool.write_text(f"#!{sys.executable}\n{PROBE}\n")
    tool.chmod(0o755)
    env_bin = shutil.which("env")
    assert env_bin is not None
    cases = [  # (command, prefix, code, stdout): here, -m, -c, a console script, exec'd with options or a prefix
        (["python", job, "a"], None, 0, f"__main__ ['{job}', 'a'] {tmp_path} False"),
        (["python", "-m", "pkg", "b"], None, 4, f"__main__ ['{tmp_path}/pkg/__main__.py', 'b'] {tmp_path} False"),
        (["python", "-c", PROBE, "c"], None, 0, "__main__ ['-c', 'c']  False"),
        (["./tool", "d"], None, 0, f"__main__ ['./tool', 'd'] {tmp_path} False"),
        (["python", "-X", "utf8", "-W", "ignore", job], None, 0, f"__main__ ['{job}'] {tmp_path} False"),
        (["python", job], [env_bin, "VIA_PREFIX=1"], 0, f"__main__ ['{job}'] {tmp_path} False"),
    ]
    for command, prefix, code, stdout in cases:
        res = rank(tmp_path, *command, prefix=prefix)
        assert (res.returncode, res.stdout.strip(), res.stderr) == (code, stdout, ""), command
        assert exit_record(tmp_path)["exit_code"] == code, command  # each took the clean exit


def test_python_call_leaves_other_forms_to_exec(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text("")
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        call = rank_entry.python_call([sys.executable, "-uWignore", "job.py", "x"], {})
        assert call is not None and (call.options, call.kind, call.target, call.args) == (
            ["-u", "-W", "ignore"], "path", "job.py", ["x"])
        for command in (["python"], ["python", "-"], ["python", "-i", "job.py"], ["python", "missing.py"],
                        ["python", "app.pyz"], ["python2", "job.py"], ["bash", "-c", "true"], ["python", "--help"]):
            assert rank_entry.python_call(command, {"PATH": os.environ["PATH"]}) is None, command
    finally:
        os.chdir(here)


def test_launcher_summary_notes_the_clean_exit_of_the_last_attempt(tmp_path: Path) -> None:
    exits = tmp_path / rank_entry.EXITS_DIR
    exits.mkdir()
    records = {"rank0.json": (0, 0, ["gloo_tcp_loop"]), "rank0.attempt1.json": (0, 1, ["a", "b", "b"]),
               "rank1.attempt1.json": (1, 1, ["a", "b", "b"]), "rank2.attempt1.json": (2, 1, [])}
    for name, (r, attempt, threads) in records.items():
        (exits / name).write_text(json.dumps({"rank": r, "attempt": attempt, "exit_code": 0, "ended": "returned",
                                              "native_threads": threads}))
    (exits / "rank3.attempt1.json").write_text("{")  # cut short: left out
    found = rank_exits(tmp_path)
    assert [(r["rank"], r["attempt"]) for r in found] == [(0, 1), (1, 1), (2, 1)]
    note = clean_exit_note(found)
    assert note is not None and note.startswith("clean exit: ranks 0,1,2 ended when the script did")
    assert note.endswith("native threads left running: a, 2 b in ranks 0,1")
    assert clean_exit_note(()) is None

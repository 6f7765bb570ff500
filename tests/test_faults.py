"""Fault injection: hostile text, signals, killed processes, missing and broken files.

Real processes receive real signals, and real files are removed or corrupted; the
expectation is always the same: no traceback, no silently different number, and no
Run that lies about itself.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from profilednn.cli import run_cli
from profilednn.errors import ProfileDNNError, RunError
from profilednn.outputs import check_output_dir, check_output_file, check_threads, usable_cpus
from profilednn.report.listing import list_runs
from profilednn.run import create_run, load_run, process_gone
from cached_machine import cached_box, use_cached
from runfactory import make_run

HOSTILE = "[/red]"
PY = sys.executable


# --------------------------------------------------------------------------- helpers
def _cli(capsys, argv: list[str]) -> tuple[int, str, str]:
    code = run_cli([str(a) for a in argv])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def _one_line_error(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one line, got:\n{err}"
    assert "Traceback" not in err and "MarkupError" not in err
    return lines[0]


def _wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _measured_markers(runs_dir: Path) -> int:
    """Steps the capture child has measured so far (step_end markers in its live log)."""
    n = 0
    for partial in runs_dir.glob("*/.verbose.log.partial"):
        with open(partial, "rb") as fh:
            n += fh.read().count(b",step_end,")
    return n


def _topology_file(tmp_path: Path, cpus: int) -> Path:
    p = tmp_path / "topo.json"
    p.write_text(json.dumps({"model_name": "test CPU", "physical_cores": cpus, "sockets": 1,
                             "threads_per_core": 1, "isa": ["avx2", "fma"]}))
    return p


# --------------------------------------------------------------------------- 1. markup
def _verb_cases(tmp: Path) -> list[tuple[str, list[str]]]:
    bad = str(tmp / f"x{HOSTILE}y")
    afile = tmp / f"f{HOSTILE}.txt"  # "[/red]" holds a slash: a folder "f[" and a file in it
    afile.parent.mkdir(parents=True, exist_ok=True)
    afile.write_text("not a directory\n")
    return [
        ("parse", ["parse", bad + ".log"]),
        ("breakdown", ["breakdown", str(tmp / f"run[old]{HOSTILE}.log")]),
        ("models", ["models", HOSTILE]),
        ("profile", ["profile", "--model", "small_cnn", "-o", str(afile / "runs")]),
        ("profile", ["profile", "--model", "small_cnn", "--dtype", HOSTILE]),  # a usage error
        ("demo", ["demo", "-o", str(afile / "runs")]),
        ("report", ["report", bad]),
        ("compare", ["compare", bad, bad + "2"]),
        ("runs", ["runs", bad]),
        ("machine", ["machine", "-o", str(afile / "m.toml")]),
        ("project", ["project", bad]),
        ("engines", ["engines", "--model", f"nosuch{HOSTILE}", "--runs-dir", str(afile / "r")]),
        ("optimize", ["optimize", "--model", "small_cnn", "-o", str(afile / "runs")]),
        ("optimize", ["optimize", "-o", str(afile / "runs"), "--", "python", bad + ".py"]),
        ("apply", ["apply", bad, "--", "python", "x.py"]),
        ("launch", ["launch", "--nproc-per-node", "1", "--threads-per-rank", "1", "--dry-run", "--",
                    "python", "x.py", f"[red]HIDDEN{HOSTILE}"]),
        ("follow", ["follow", "--nnodes", "2", "--node-rank", "1", "--master-addr", f"x{HOSTILE}y",
                    "--node-timeout", "2"]),
        ("train", ["train", "--model", "small_cnn", "-o", str(afile / "runs")]),
        ("ranks", ["ranks", bad]),
        ("scale", ["scale", "--model", "small_cnn", "-o", str(afile / "runs")]),
        ("convergence", ["convergence", "-o", str(afile / "runs")]),
        ("project-nodes", ["project-nodes", bad]),
        ("memory", ["memory", bad]),
        ("pipeline", ["pipeline", "--model", "digits_mlp", "--from-run", bad]),
    ]


def test_every_verb_prints_user_text_verbatim(tmp_path, capsys):
    """A path or argument holding rich markup is printed as typed, by every verb."""
    from profilednn.cli import app

    verbs = {c.name for c in app.registered_commands} - {"version"}
    cases = _verb_cases(tmp_path)
    assert verbs <= {name for name, _ in cases}, f"verbs without a markup case: {verbs - {n for n, _ in cases}}"
    for name, argv in cases:
        code, out, err = _cli(capsys, argv)
        both = out + err
        assert "Traceback" not in both and "MarkupError" not in both, (name, both)
        flat = re.sub(r"[\s│]+", "", both)  # rich may wrap a long path inside a panel
        assert HOSTILE in flat, (name, code, both)
        if name == "launch":
            assert "[red]HIDDEN" in flat, both


def test_profile_into_a_hostile_directory_prints_its_path(tmp_path, capsys):
    runs = tmp_path / f"m{HOSTILE}x"
    code, out, err = _cli(capsys, ["profile", "--model", "small_cnn", "--batch-size", "2", "--image-size", "8",
                                   "--steps", "1", "--warmup", "0", "--light", "-o", runs])
    assert code == 0, err
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    assert f"Run: {run_dir}" in out.replace("\n", "")
    assert "Memory block of unknown size" not in err


def test_error_line_keeps_brackets_of_the_named_file(tmp_path, capsys):
    code, _, err = _cli(capsys, ["breakdown", tmp_path / "run[old].log"])
    assert code == 1
    assert "run[old].log" in _one_line_error(err)


# --------------------------------------------------------------------------- 2. signals
def _spawn(argv: list[str], cwd: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200")
    return subprocess.Popen([PY, "-m", "profilednn", *argv], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _sigterm_once(proc: subprocess.Popen, ready, what: str) -> str:
    """SIGTERM ``proc`` once ``ready()`` holds (it must still run then); its stderr."""
    try:
        _wait_for(lambda: ready() or proc.poll() is not None, 240, what)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGTERM)
        return proc.communicate(timeout=240)[1]
    finally:
        if proc.poll() is None:
            proc.kill()


def test_sigterm_keeps_the_measured_steps(tmp_path, capsys):
    """`timeout`/a scheduler's SIGTERM ends a profile like Ctrl-C: Run `interrupted`, its
    measured steps kept; --oversubscribe is accepted and the Run says so."""
    runs = tmp_path / "runs"
    threads = usable_cpus() + 1
    proc = _spawn(["profile", "--model", "small_cnn", "--batch-size", "2", "--image-size", "8", "--warmup", "0",
                   "--steps", "100000", "--light", "--threads", str(threads), "--oversubscribe", "-o", str(runs)],
                  tmp_path)
    err = _sigterm_once(proc, lambda: _measured_markers(runs) >= 3, "3 measured steps")
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err and "Memory block of unknown size" not in err
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    assert str(run_dir) in err.replace("\n", "")  # the interrupt message names the Run
    run = load_run(run_dir)
    assert run.status == "interrupted" and run.manifest["exit_code"] == 143
    assert run.manifest["steps"] >= 3 and run.table("steps").height == run.manifest["steps"]
    assert run.table("primitives").height > 0
    assert any("oversubscribed" in n for n in run.manifest["notes"])
    assert run.manifest["process"]["pid"] == proc.pid
    code, out, _ = _cli(capsys, ["report", run_dir])
    assert code == 0 and "oversubscribed" in out.replace("\n", " ")
    assert list_runs(runs)["status"].to_list() == ["interrupted"]



def test_sigterm_keeps_the_recipes_an_optimize_decided(tmp_path, capsys):
    """An optimize stopped by SIGTERM mid-recipe keeps the recipes decided before it, and
    `report` says how far it got (fused_loss is decided at once: small_cnn has no focal loss;
    channels_last's 100000 rounds outlast the test)."""
    runs = tmp_path / "runs"
    proc = _spawn(["optimize", "--model", "small_cnn", "--batch-size", "2", "--image-size", "8", "--recipes",
                   "fused_loss,channels_last", "--rounds", "100000", "--numerics-steps", "2", "-o", str(runs)],
                  tmp_path)
    err = _sigterm_once(proc, lambda: any(runs.glob("*/optimize_recipes.parquet")), "the first recipe's decision")
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    run = load_run(run_dir)
    assert run.status == "interrupted" and run.manifest["exit_code"] == 143
    (row,) = run.table("optimize_recipes").to_dicts()
    assert row["recipe"] == "fused_loss" and not row["applies"]
    code, out, _ = _cli(capsys, ["report", run_dir])
    assert code == 0
    assert ("this optimize ended interrupted after 1 of 2 recipes (channels_last not decided)"
            in " ".join(out.split()))


@pytest.fixture
def python_sigint():
    """Python's own Ctrl-C handling for one test, whatever pytest inherited: started in the
    background by a shell without job control, a process gets SIGINT ignored, and Python then
    installs no KeyboardInterrupt handler of its own."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_between_an_optimize_s_writes_waits_for_its_progress(tmp_path, monkeypatch, signum, python_sigint):
    """The race behind a once-in-four failure of the test above: a signal that lands after
    the recipes table is written but before the manifest counts the recipe. It waits until
    the tables and the progress are all written, then ends the job (Ctrl-C likewise)."""
    from profilednn.interrupts import Terminated, signals_as_interrupts
    from profilednn.optimization.partial import ResultLog
    from profilednn.optimization.results import RecipeResult
    from profilednn.run import Run

    write_table = Run.write_table

    def signal_after_the_recipes_table(self, name, df):
        path = write_table(self, name, df)
        if str(name) == "optimize_recipes":
            os.kill(os.getpid(), signum)  # raised at once, were it not deferred
        return path

    monkeypatch.setattr(Run, "write_table", signal_after_the_recipes_table)
    decided = [RecipeResult("fused_loss", "custom kernel", False, "no focal loss")]
    with pytest.raises(KeyboardInterrupt) as stopped, signals_as_interrupts():
        with create_run(tmp_path, label="optimize-small_cnn", kind="optimize") as run:
            ResultLog(run, "fused_loss,channels_last")(decided)
    assert isinstance(stopped.value, Terminated) == (signum == signal.SIGTERM)
    run = load_run(run.path)
    assert run.status == "interrupted"
    assert run.manifest["tables"] == ["optimize_recipes", "optimize_samples"]
    assert run.manifest["optimize_progress"] == {"decided": ["fused_loss"], "planned": ["fused_loss", "channels_last"]}
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


SCRIPT = """
import subprocess, sys, torch
child = subprocess.Popen(["sleep", "600"])
open(sys.argv[1], "w").write(str(child.pid))
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(8, 4)
while True:
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_sighup_reaches_the_scripts_children(tmp_path):
    """`profile -- script`: SIGHUP is passed on to the script's child processes and the
    Run keeps what it measured."""
    import psutil

    script, pid_file, runs = tmp_path / "train.py", tmp_path / "child.pid", tmp_path / "runs"
    script.write_text(SCRIPT)
    proc = _spawn(["profile", "--steps", "100000", "--warmup", "0", "--light", "-o", str(runs), "--",
                   "python", str(script), str(pid_file)], tmp_path)
    try:
        _wait_for(lambda: (pid_file.exists() and _measured_markers(runs) >= 2) or proc.poll() is not None,
                  240, "the script to start and measure 2 steps")
        assert proc.poll() is None, proc.communicate()
        child = int(pid_file.read_text())
        proc.send_signal(signal.SIGHUP)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGHUP, err
    assert "Traceback" not in err

    def child_gone() -> bool:
        try:
            return psutil.Process(child).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    _wait_for(child_gone, 30, "the script's child to end")
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    run = load_run(run_dir)
    assert run.status == "interrupted" and run.manifest["steps"] >= 2


def test_killed_capture_is_dead_not_running(tmp_path, capsys):
    """SIGKILL leaves a manifest saying `running`; `runs` and `report` call it dead."""
    code = ("import sys, time; from profilednn.run import create_run; "
            "r = create_run(sys.argv[1], label='victim'); print(r.path, flush=True); time.sleep(600)")
    proc = subprocess.Popen([PY, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        run_dir = Path(proc.stdout.readline().strip())
        assert list_runs(tmp_path)["status"].to_list() == ["running"]  # alive: running
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "running" and manifest["process"]["pid"] == proc.pid
    assert manifest["heartbeat"]
    assert list_runs(tmp_path)["status"].to_list() == ["dead"]
    code, out, err = _cli(capsys, ["runs", tmp_path])
    assert code == 0 and "dead" in out and run_dir.name in out.replace("\n", "")
    code, _, err = _cli(capsys, ["report", run_dir])
    assert code == 1 and "dead" in _one_line_error(err)


def test_heartbeat_and_other_hosts(tmp_path):
    run = create_run(tmp_path, label="beat")
    first = run.manifest["heartbeat"]
    run.stop_heartbeat()
    run.start_heartbeat(interval_s=0.05)
    time.sleep(1.1)  # the timestamps have one-second resolution
    _wait_for(lambda: json.loads((run.path / "manifest.json").read_text())["heartbeat"] != first,
              10, "a heartbeat")
    run.set_status("complete")
    assert run.status == "complete"
    # another host: only the heartbeat can tell
    foreign = {"status": "running", "process": {"pid": 1, "host": "elsewhere"},
               "heartbeat": "2026-01-01T00:00:00+00:00"}
    assert process_gone(foreign)
    assert not process_gone(foreign, now=1767225600.0 + 10)  # 10 s after that heartbeat


# --------------------------------------------------------------------------- 3. missing tables
def _normalise(text: str, run_dirs: list[Path]) -> str:
    for d in run_dirs:
        text = text.replace(str(d), "RUN").replace(d.name, "RUN")
    return re.sub(r"\s+", " ", text)


def _job(job: str, tmp: Path, spec: dict) -> tuple[list[str], list[Path]]:
    if job == "project":  # the synthetic ops carry no input shapes the step model can read
        spec = {**spec, "light": True}
    a = make_run(tmp / "a", **spec)
    if job == "compare":
        b = make_run(tmp / "b", **spec)
        return ["compare", a.path, b.path, "-o", tmp / "cmp.html"], [a.path, b.path]
    if job == "project":
        return ["project", a.path, "--no-replay"], [a.path]
    if job == "report":
        return ["report", a.path, "-o", tmp / "report.html"], [a.path]
    return ["runs", tmp / "a"], [a.path]


TABLES = ("primitives", "ops", "op_events", "layers", "steps", "spans")


@pytest.mark.parametrize("job", ["report", "compare", "project", "runs"])
def test_each_job_with_each_table_missing(tmp_path, capsys, job, monkeypatch):
    """Remove each table the manifest lists: the job fails in one line naming the file,
    warns about it, or (a table it does not read) prints exactly what it printed before."""
    # a cached machine without a probe's reference: `project` measures nothing now (with the host's
    # cache it probed the machine on every call, and a drift beyond noise re-measured the peaks, so
    # its roofline and MFU changed between two calls: CI, session 53)
    use_cached(monkeypatch, tmp_path / "cache", cached_box())
    argv, dirs = _job(job, tmp_path / "base", {})
    code, base_out, base_err = _cli(capsys, argv)
    assert code == 0, base_err
    baseline = _normalise(base_out, dirs)
    for table in TABLES:
        case = tmp_path / table
        argv, dirs = _job(job, case, {})
        victim = dirs[-1] / f"{table}.parquet"
        if not victim.exists():
            continue  # this kind of Run never has it
        victim.unlink()
        code, out, err = _cli(capsys, argv)
        assert "Traceback" not in out + err, (job, table, err)
        if code != 0:
            assert code == 1
            assert f"{table}.parquet" in _one_line_error(err), (job, table, err)
        elif f"{table}.parquet" not in out + err:
            assert _normalise(out, dirs) == baseline, f"{job} silently changed without {table}.parquet"


def test_missing_primitives_is_not_a_zero(tmp_path, capsys):
    """The reported case: without primitives.parquet, report must not show oneDNN 0%."""
    run = make_run(tmp_path)
    (run.path / "primitives.parquet").unlink()
    code, out, err = _cli(capsys, ["report", run.path])
    assert code == 1 and "primitives.parquet is missing" in _one_line_error(err)
    assert not (run.path / "report.html").exists()


def test_unreadable_table_names_the_file(tmp_path, capsys):
    run = make_run(tmp_path)
    (run.path / "steps.parquet").write_bytes(b"not parquet at all")
    code, _, err = _cli(capsys, ["report", run.path])
    assert code == 1 and "steps.parquet" in _one_line_error(err)
    row = list_runs(tmp_path).row(0, named=True)
    assert row["status"] == "damaged" and "steps.parquet" in row["error"]


# --------------------------------------------------------------------------- 4. listing
@pytest.mark.parametrize("manifest", [
    {"schema_version": "x", "id": "a", "status": "complete"},
    {"schema_version": 1, "id": "b", "status": "complete", "tables": "primitives"},
    {"schema_version": 1, "id": ["c"], "status": "complete", "workload": "oops", "steps": "three"},
    ["not", "an", "object"],
])
def test_runs_lists_every_broken_run(tmp_path, capsys, manifest):
    make_run(tmp_path, workload="good")
    bad = tmp_path / "zz-bad"
    bad.mkdir()
    (bad / "manifest.json").write_text(json.dumps(manifest))
    table = list_runs(tmp_path)
    assert table.height == 2 and table["status"][0] == "complete"
    code, out, err = _cli(capsys, ["runs", tmp_path])
    assert code == 0 and "Traceback" not in err
    assert "zz-bad" in out and "good" in out


def test_runs_on_a_file_is_a_usage_error(tmp_path, capsys):
    f = tmp_path / "some.log"
    f.write_text("x\n")
    code, out, err = _cli(capsys, ["runs", f])
    flat = re.sub(r"[\s│]+", " ", err)
    assert code == 2 and "is a file" in flat and "Traceback" not in err


def test_runs_shows_the_directory_of_a_copied_run(tmp_path, capsys):
    import shutil

    run = make_run(tmp_path / "src")
    shutil.copytree(run.path, tmp_path / "runs" / "copy-one")
    shutil.copytree(run.path, tmp_path / "runs" / "copy-two")
    code, out, _ = _cli(capsys, ["runs", tmp_path / "runs"])
    flat = out.replace("\n", "").replace("│", "").replace(" ", "")
    assert code == 0 and "copy-one" in flat and "copy-two" in flat


# --------------------------------------------------------------------------- 5. outputs
@pytest.mark.parametrize("verb", ["report", "compare", "parse"])
def test_unwritable_output_is_one_line_before_work(tmp_path, capsys, verb):
    afile = tmp_path / "plain.txt"
    afile.write_text("x\n")
    out_path = afile / "out.html"
    missing = tmp_path / "no-such-run"  # would fail too, but only after the output check
    argv = {"report": ["report", missing, "-o", out_path],
            "compare": ["compare", missing, missing, "-o", out_path],
            "parse": ["parse", missing, "-o", out_path]}[verb]
    code, _, err = _cli(capsys, argv)
    line = _one_line_error(err)
    assert code == 1 and "cannot write" in line and str(out_path) in line


def test_output_checks(tmp_path):
    afile = tmp_path / "f"
    afile.write_text("x")
    assert check_output_dir(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    assert not (tmp_path / "new").exists()  # checking creates nothing
    with pytest.raises(RunError, match="is a file"):
        check_output_dir(afile)
    with pytest.raises(RunError, match="is a directory"):
        check_output_file(tmp_path)
    with pytest.raises(RunError, match="cannot write"):
        check_output_file(afile / "x.html")


def test_write_failure_mid_job_is_one_line(tmp_path, capsys):
    """A failure the pre-check cannot foresee (the Run folder refuses report.html)."""
    run = make_run(tmp_path)
    (run.path / "report.html").mkdir()  # os.replace onto a directory fails
    code, _, err = _cli(capsys, ["report", run.path])
    assert code == 1 and "report.html" in _one_line_error(err)


# --------------------------------------------------------------------------- 6. threads
def test_threads_above_the_cpus_need_oversubscribe(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PROFILEDNN_TOPOLOGY", str(_topology_file(tmp_path, 2)))
    assert usable_cpus() == 2
    assert check_threads(2) == 2 and check_threads(None) is None
    assert check_threads(3, oversubscribe=True) == 3
    with pytest.raises(ProfileDNNError, match="--oversubscribe"):
        check_threads(3)
    with pytest.raises(ProfileDNNError, match=">= 1"):
        check_threads(0, oversubscribe=True)
    code, _, err = _cli(capsys, ["profile", "--model", "small_cnn", "--threads", "999", "-o", tmp_path / "r"])
    assert code == 2 and "--oversubscribe" in err and not (tmp_path / "r").exists()
    # --oversubscribe after --threads is honoured too (the flag is read eagerly)
    code, _, err = _cli(capsys, ["memory", "--threads", "3", "--oversubscribe", "--model", f"nosuch{HOSTILE}",
                                 "-o", tmp_path / "r"])
    assert code == 1 and "nosuch" in err


def test_threads_limit_starts_no_torch(tmp_path):
    """A bad option is refused while parsing, before torch is imported."""
    code = ("import sys; from profilednn.cli import run_cli; "
            "c = run_cli(['profile', '--model', 'small_cnn', '--threads', '100000', '-o', sys.argv[1]]); "
            "print(c, 'torch' in sys.modules)")
    res = subprocess.run([PY, "-c", code, str(tmp_path / "r")], capture_output=True, text=True, timeout=120)
    assert res.stdout.split()[-2:] == ["2", "False"], res.stdout + res.stderr


# --------------------------------------------------------------------------- 8. temp dirs
def test_replay_removes_its_temporary_folder(tmp_path, monkeypatch):
    from profilednn.projection import replay

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(replay.sys, "executable", "/bin/false")  # the worker fails at once
    with pytest.raises(ProfileDNNError, match="replay worker failed"):
        replay.run_worker([], 1)
    assert not list(tmp_path.glob("profilednn-replay-*"))
    monkeypatch.setattr(replay.sys, "executable", PY)
    result = replay.run_worker([], 1)  # a real worker, nothing to time
    assert result.log_path is None and not list(tmp_path.glob("profilednn-replay-*"))


def test_cli_sources_print_no_markup():
    """The CLI consoles have markup off, so a "[yellow]...[/]" string would print as is:
    styles go through ``styled``/rich Text. Guards every verb module, present and future."""
    import profilednn.cli as cli_pkg
    import profilednn.report.terminal as terminal

    markup = re.compile(r"\[/\]|\[/?(?:bold|dim|italic|red|green|yellow|cyan|blue|magenta)\b[^\]]*\]")
    files = sorted(Path(cli_pkg.__file__).parent.glob("*.py")) + [Path(terminal.__file__)]
    found = [f"{f.name}:{i}: {line.strip()}" for f in files
             for i, line in enumerate(f.read_text().splitlines(), 1)
             if markup.search(line) and not line.strip().startswith("#")]
    assert not found, "rich markup in CLI strings:\n" + "\n".join(found)


def test_memory_and_optimize_runs_note_oversubscription(tmp_path, monkeypatch):
    """Every job that takes --threads says in its Run when it ran more threads than CPUs."""
    import torch

    from profilednn.memory.runs import memory_run
    from profilednn.optimization.workload import optimize_workload

    monkeypatch.setenv("PROFILEDNN_TOPOLOGY", str(_topology_file(tmp_path, 1)))
    before = torch.get_num_threads()
    try:
        run = memory_run("small_cnn", tmp_path / "m", threads=2, knobs={"batch_size": 2, "image_size": 16})
        assert run.status == "complete"
        assert any("oversubscribed: 2 intra-op threads on 1 CPU" in n for n in run.manifest["notes"])
        run, _ = optimize_workload("small_cnn", tmp_path / "o", ["fused_optimizer"], threads=2,
                                   batch_size=2, image_size=16)
        assert any("oversubscribed" in n for n in run.manifest["notes"])
        run = memory_run("small_cnn", tmp_path / "m", threads=1, knobs={"batch_size": 2, "image_size": 16})
        assert not any("oversubscribed" in n for n in run.manifest.get("notes") or [])
    finally:
        torch.set_num_threads(before)

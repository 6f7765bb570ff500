"""``profile --stop-after``: a script is stopped once its measured steps are captured; without
the flag it runs on to its end. Real subprocesses of the CLI, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from profilednn import load_run, profile_script
from profilednn.errors import ProfileDNNError

ON_EXIT = 'atexit.register(lambda: print("atexit handler ran", flush=True))'
SCRIPT = """
import atexit
import torch
from torch import nn

{on_exit}
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(4, 8), torch.tensor([0, 1, 0, 1])
try:
    for step in range({steps}):
        print(f"user step {{step}}", flush=True)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
except Exception:  # a script's own handler must not swallow the stop
    print("swallowed", flush=True)
finally:
    print("finally block ran", flush=True)
print("trained to the end", flush=True)
"""


def _profile(tmp_path: Path, steps: int, *flags: str) -> tuple[subprocess.CompletedProcess, Path]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(steps=steps, on_exit=ON_EXIT))
    runs = tmp_path / "runs"
    proc = subprocess.run(
        [sys.executable, "-m", "profilednn", "profile", *flags, "--warmup", "1", "--steps", "2",
         "-o", str(runs), "--", "python", str(script)],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, COLUMNS="200"), check=False)
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    return proc, run_dir


def test_stop_after_stops_a_long_script_once_the_window_is_captured(tmp_path: Path) -> None:
    proc, run_dir = _profile(tmp_path, 10_000, "--stop-after")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    # the user's own output up to the stop reached the terminal; the loop went no further
    assert all(f"user step {i}" in out for i in range(3)) and "user step 3" not in out
    assert "trained to the end" not in out and "swallowed" not in out
    assert "finally block ran" in out and "atexit handler ran" in out
    assert "Traceback" not in proc.stderr and "StopAfterWindow" not in proc.stderr + out
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["exit_code"] == 0
    assert manifest["stopped_after_steps"] == 3
    assert any("stopped after 3 steps (1 warm-up + 2 measured)" in n for n in manifest["notes"])
    assert "error" not in manifest
    run = load_run(run_dir)
    assert run.steps.height == 2 and {"0", "2"} <= set(run.layers["module"])
    assert f"Run: {run_dir}" in out.replace("\n", "")


def test_without_the_flag_the_script_runs_to_its_end(tmp_path: Path) -> None:
    proc, run_dir = _profile(tmp_path, 6)
    assert proc.returncode == 0, proc.stderr
    assert "user step 5" in proc.stdout and "trained to the end" in proc.stdout
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "complete" and "stopped_after_steps" not in manifest
    assert not any("stopped after" in n for n in manifest["notes"])
    assert load_run(run_dir).steps.height == 2


def test_the_python_api_takes_stop_after(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(steps=10_000, on_exit=""))  # no atexit handler in pytest's process
    run, code = profile_script(["python", str(script)], tmp_path / "runs", steps=1, warmup=0, stop_after=True)
    out = capfd.readouterr().out
    assert code == 0 and run.status == "complete" and run.manifest["stopped_after_steps"] == 1
    assert "user step 0" in out and "user step 1" not in out and "finally block ran" in out
    with pytest.raises(ProfileDNNError, match="--stop-after needs"):
        profile_script(["python", str(script)], tmp_path / "runs", steps=None, stop_after=True)


def test_stop_after_is_refused_for_a_builtin_model(tmp_path: Path) -> None:
    from profilednn.cli import run_cli

    assert run_cli(["profile", "--model", "small_cnn", "--stop-after", "-o", str(tmp_path)]) == 2
    assert not tmp_path.joinpath("runs").exists() and not any(tmp_path.iterdir())

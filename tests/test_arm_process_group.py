"""A single-process arm ends every process its script started: a script that leaves a
process running (a server, a framework's helper) must not leave it behind the arm, nor
after a timeout."""

from __future__ import annotations

import os
import signal
import textwrap
from pathlib import Path

import pytest

from profilednn.optimization.script.runner import ArmError, run_arm_process

from processes import gone_within

LEAVES_A_PROCESS = """
import subprocess, sys, time
import torch
from torch import nn

child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open({pid_file!r}, "w").write(str(child.pid))
torch.manual_seed(0)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range({iters}):
    opt.zero_grad()
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
time.sleep({linger})
"""


def _script(tmp_path: Path, iters: int, linger: float) -> tuple[str, Path]:
    pid_file = tmp_path / "child.pid"
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(LEAVES_A_PROCESS.format(pid_file=str(pid_file), iters=iters, linger=linger)))
    return str(path), pid_file


def _checkgone_within(pid_file: Path) -> None:
    child = int(pid_file.read_text())
    if not gone_within(child, 10):
        os.kill(child, signal.SIGKILL)
        pytest.fail("the process the script started was left running after its arm")


def test_an_arm_ends_the_process_its_script_left_running(tmp_path: Path) -> None:
    script, pid_file = _script(tmp_path, iters=6, linger=0)
    out = run_arm_process({"argv": ["python", script], "warmup": 1, "steps": 2, "seed": 0}, {}, timeout_s=120)
    assert len(out.times_ms) == 2
    _checkgone_within(pid_file)


def test_an_arm_that_times_out_ends_its_whole_group(tmp_path: Path) -> None:
    script, pid_file = _script(tmp_path, iters=1, linger=600)  # never reaches its window
    with pytest.raises(ArmError, match="did not finish its 3 steps within 20 s"):
        run_arm_process({"argv": ["python", script], "warmup": 1, "steps": 2, "seed": 0}, {}, timeout_s=20)
    _checkgone_within(pid_file)

"""A built-in launch-environment child (``child_ab``: ``python -m profilednn.optimization.child``)
that hangs past its timeout is ended with its whole process group: a process it started must
not outlive the arm, as for a script's arm (``test_arm_process_group.py``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from profilednn.optimization.child_ab import child_payload, children_ab
from profilednn.optimization.settings import Settings
from profilednn.train_step import TrainStep

from processes import gone_within

TESTS = str(Path(__file__).resolve().parent)


class StartsAProcessAndHangs:
    """Applied in the child (unpickled there from this module): starts a process that would
    run for ten minutes, writes its pid to ``pid_file``, then hangs."""

    name = "starts_a_process_and_hangs"

    def __init__(self, pid_file: str) -> None:
        self.pid_file = pid_file

    def apply(self, setup: TrainStep, ctx: object) -> str:
        import time

        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        Path(self.pid_file).write_text(str(child.pid))
        time.sleep(600)
        return "never"


def test_a_built_in_child_that_times_out_ends_its_whole_group(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    setup = TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.01), nn.MSELoss(),
                      [(torch.ones(2, 4), torch.zeros(2, 1))])
    pid_file = tmp_path / "child.pid"
    settings = Settings(child_timeout_s=30, child_runs=1)
    payload = child_payload(setup, [StartsAProcessAndHangs(str(pid_file))], settings)  # type: ignore[list-item]
    path = os.pathsep.join(p for p in (TESTS, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path}  # the child unpickles the recipe from this module
    with pytest.raises(subprocess.TimeoutExpired):
        children_ab((payload, env), (payload, env), settings, lambda line: None, "hangs")
    assert pid_file.exists(), "the child never started its process (it should have, well within 30 s)"
    started = int(pid_file.read_text())
    if not gone_within(started, 10):
        os.kill(started, signal.SIGKILL)
        pytest.fail("the process the built-in child started was left running after its timeout")

"""``with create_run(...) as run:`` gives every Run its final status, whatever ends the job."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch

from profilednn.errors import InputError
from profilednn.interrupts import Terminated
from profilednn.run import create_run, iter_runs, load_run


def test_a_block_that_ends_normally_completes_the_run(tmp_path: Path) -> None:
    with create_run(tmp_path, label="ok") as run:
        assert load_run(run.path).recorded_status == "running"
    assert load_run(run.path).recorded_status == "complete"
    assert "finished" in load_run(run.path).manifest


def test_an_error_fails_the_run_with_its_traceback_and_propagates(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="bad shape") as caught:
        with create_run(tmp_path, label="boom") as run:
            raise ValueError("bad shape")
    saved = load_run(run.path).manifest
    assert saved["status"] == "failed"
    assert saved["error"] == "ValueError: bad shape"
    assert "raise ValueError" in saved["traceback"]
    assert saved["exit_code"] == 1
    assert caught.value.run.path == run.path  # whoever catches it can name the Run


@pytest.mark.parametrize(("exc", "code"), [(KeyboardInterrupt(), 130),
                                           (Terminated(signal.SIGTERM), 128 + signal.SIGTERM)])
def test_ctrl_c_and_sigterm_interrupt_the_run(tmp_path: Path, exc: BaseException, code: int) -> None:
    with pytest.raises(KeyboardInterrupt):
        with create_run(tmp_path, label="stop") as run:
            raise exc
    saved = load_run(run.path).manifest
    assert saved["status"] == "interrupted"
    assert saved["exit_code"] == code


def test_a_status_the_job_set_itself_is_kept(tmp_path: Path) -> None:
    with create_run(tmp_path, label="own") as run:
        run.set_status("complete", answer=42)
    saved = load_run(run.path).manifest
    assert saved["status"] == "complete" and saved["answer"] == 42


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a device that does not exist here")
def test_a_job_that_fails_after_creating_its_run_leaves_it_failed(tmp_path: Path) -> None:
    from profilednn.memory import memory_run

    with pytest.raises(InputError, match="not available"):
        memory_run("small_cnn", tmp_path, device="cuda:7", knobs={"batch_size": 2, "image_size": 16})
    (run,) = list(iter_runs(tmp_path))
    assert run.recorded_status == "failed"
    assert "InputError" in run.manifest["error"] and run.manifest["traceback"]


@pytest.mark.parametrize(("code", "status", "exit_code"), [(0, "complete", 0), (None, "complete", 0),
                                                         (3, "failed", 3), ("bad input", "failed", 1)])
def test_sys_exit_ends_the_run_with_its_exit_code(tmp_path: Path, code: object, status: str, exit_code: int) -> None:
    with pytest.raises(SystemExit):
        with create_run(tmp_path, label="exit") as run:
            raise SystemExit(code)
    saved = load_run(run.path).manifest
    assert saved["status"] == status and saved["exit_code"] == exit_code
    assert ("error" in saved) == (status == "failed")

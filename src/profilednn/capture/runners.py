"""Three ways into a capture: a built-in workload, an unmodified script, the Python API."""

from __future__ import annotations

import contextlib
import runpy
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

from ..errors import ProfileDNNError, WorkloadError
from ..interrupts import interrupt_exit_code, system_exit_code
from ..run import Run
from ..tables import PHASES
from .own_ranks import launched_world_size, own_ranks_note
from .script_target import print_script_traceback, script_target
from .session import CaptureSession, _StopAfterWindow, stop_after_note

if TYPE_CHECKING:
    from ..train_step import TrainStep

ProgressFn = Callable[[int, int], None]
# Backward is always seen (autograd marks it); the others a user may mark by hand.
MARKABLE_PHASES: tuple[str, ...] = tuple(p for p in PHASES if p != "backward")


def _note_oversubscription(session: CaptureSession, threads: int | None) -> None:
    from ..outputs import oversubscription_note

    note = oversubscription_note(threads)
    if note is not None:
        session.note(note)


def profile_builtin(
    name: str,
    runs_dir: Path | str = "runs",
    *,
    steps: int = 3,
    warmup: int = 1,
    threads: int | None = None,
    light: bool = False,
    command: list[str] | str | None = None,
    progress: ProgressFn | None = None,
    workload: "TrainStep | None" = None,
    **knobs: Any,
) -> Run:
    """Profile ``steps`` training steps of a built-in workload after ``warmup`` steps.

    ``workload`` reuses an already built workload (``build_workload``'s ``TrainStep``: its
    model keeps training, its data continues), so several captures can be compared on the
    same weights in one process.
    """
    from ..workloads import build_workload

    if threads is not None:
        if threads < 1:
            raise ProfileDNNError(f"--threads must be >= 1, not {threads}")
        torch.set_num_threads(threads)
    wl = workload if workload is not None else build_workload(name, **knobs)
    session = CaptureSession(
        runs_dir, label=name, command=command,
        workload={"kind": "builtin", "name": name, "config": wl.config,
                  "items_per_batch": wl.items_per_batch},
        warmup=warmup, steps=steps, light=light, auto_steps=False,
    )
    _note_oversubscription(session, threads)
    total = warmup + steps
    with session:
        for i in range(total):
            result = wl.run(phase=session.inst.phase)
            session.record_loss(result.loss)
            session.step_end()
            if progress is not None:
                progress(i + 1, total)
    return session.run


@contextlib.contextmanager
def _as_main(path: Path | None, module: str | None, args: list[str]) -> Iterator[None]:
    """``sys.argv`` and ``sys.path`` as the script expects them while it runs; restored after."""
    old_argv, old_path = sys.argv[:], sys.path[:]
    sys.argv = [str(path) if path else module] + args  # type: ignore[list-item]
    if path:
        sys.path.insert(0, str(path.resolve().parent))
    try:
        yield
    finally:
        sys.argv, sys.path[:] = old_argv, old_path


def _run_as_main(path: Path | None, module: str | None, ended: list[BaseException]) -> bool:
    """Run the script as ``__main__``; True when capture stopped it after its window
    (``stop_after``), False when it ran to its end. How it ended, when by an exception, is
    appended to ``ended`` and said as Python would before it propagates (the message of
    ``sys.exit("...")``, the traceback of an error)."""
    try:
        if path:
            runpy.run_path(str(path), run_name="__main__")
        else:
            runpy.run_module(module, run_name="__main__", alter_sys=True)  # type: ignore[arg-type]
    except _StopAfterWindow:
        return True  # ours, not the script's: the measured steps are captured
    except SystemExit as exc:
        ended.append(exc)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)  # as Python does for sys.exit("message")
        raise
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM/SIGHUP under the CLI
        ended.append(exc)
        raise
    except BaseException as exc:  # the script's own error
        ended.append(exc)
        print_script_traceback(exc)
        raise
    return False


def _script_exit_code(exc: BaseException) -> int:
    """The exit code of a script that ended by ``exc``, as the interpreter would report it."""
    if isinstance(exc, SystemExit):
        return system_exit_code(exc)
    if isinstance(exc, KeyboardInterrupt):
        return interrupt_exit_code(exc)
    return 1


def profile_script(
    argv: list[str],
    runs_dir: Path | str = "runs",
    *,
    steps: int | None = 3,
    warmup: int = 1,
    threads: int | None = None,
    light: bool = False,
    command: list[str] | str | None = None,
    stop_after: bool = False,
) -> tuple[Run, int]:
    """Run an unmodified training script in this process under observation.

    Each ``optimizer.step()`` ends a step; the first ``warmup`` steps are dropped and the
    next ``steps`` are kept (``None``: all). The script then runs on unobserved, or, with
    ``stop_after``, is stopped right after the last measured ``optimizer.step()`` (the Run
    ends ``complete`` with a note; the script's ``finally`` blocks and atexit handlers
    still run, its remaining iterations do not). Returns
    the Run and the script's exit code: the Run ends ``complete`` (the script ran to its
    end or called ``sys.exit(0)``), ``failed`` (an error, a non-zero exit) or
    ``interrupted``, with what was captured so far; the script's error does not propagate.
    """
    path, module, args = script_target(argv)
    if threads is not None:
        torch.set_num_threads(threads)
    label = path.stem if path else (module or "script")
    session = CaptureSession(
        runs_dir, label=label, command=command,
        workload={"kind": "script", "name": str(path or module), "argv": list(argv)},
        warmup=warmup, steps=steps, light=light, auto_steps=True, provisional_start=True,
        stop_after=stop_after,
    )
    _note_oversubscription(session, threads)
    ended: list[BaseException] = []
    launched = launched_world_size()
    try:
        with session, _as_main(path, module, args):  # the session ends the Run, as create_run does
            stopped = _run_as_main(path, module, ended)
            session.run.update(exit_code=0)  # ran to its end, or to the end of its window
            spawned = own_ranks_note(launched)
            if spawned:
                session.note(spawned)
            if stopped:
                session.run.update(stopped_after_steps=session.global_step)
                session.note(stop_after_note(session.global_step, warmup, session.measured_steps))
    except BaseException as exc:
        if not ended or exc is not ended[0]:
            raise  # ProfileDNN's own failure, not the script's
        return session.run, _script_exit_code(exc)  # the Run says how the script ended
    return session.run, 0


class Capture:
    """Handle returned by :func:`capture`: mark steps and phases, reach the Run."""

    def __init__(self, session: CaptureSession) -> None:
        self._session = session

    @property
    def run(self) -> Run:
        return self._session.run

    def step(self, loss: Any = None) -> None:
        """End the current training step (optionally recording its loss)."""
        if loss is not None:
            self._session.record_loss(loss)
        self._session.step_end()

    def phase(self, name: str) -> contextlib.AbstractContextManager[None]:
        """Mark an explicit phase, e.g. ``with cap.phase("data"): batch = next(it)``."""
        if name not in MARKABLE_PHASES:
            raise ProfileDNNError(f"unknown phase {name!r}: use {', '.join(MARKABLE_PHASES)}")
        return self._session.inst.phase(name)


@contextlib.contextmanager
def capture(
    runs_dir: Path | str = "runs",
    *,
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    warmup: int = 0,
    steps: int | None = None,
    light: bool = False,
    label: str = "capture",
) -> Iterator[Capture]:
    """Instrument your own training loop; call ``cap.step()`` at the end of each step.

    ``warmup`` steps are observed but dropped; ``steps`` limits how many are kept
    (``None``: every step until the block ends). ``model`` names the modules (otherwise
    the first module called names them); ``optimizer`` is recorded in the manifest.
    """
    if model is not None and not isinstance(model, torch.nn.Module):
        raise WorkloadError("model must be a torch.nn.Module")
    session = CaptureSession(
        runs_dir, label=label, command=None,
        workload={"kind": "api", "name": type(model).__name__ if model is not None else label,
                  "optimizer": type(optimizer).__name__ if optimizer is not None else None},
        warmup=warmup, steps=steps, light=light, auto_steps=False, window_from_start=True,
    )
    if model is not None:
        session.inst.names.register_root(model)
    with session:
        yield Capture(session)

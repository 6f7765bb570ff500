"""Termination signals handled like Ctrl-C.

Schedulers and ``timeout`` stop a job with SIGTERM, a closed terminal sends SIGHUP. By
default either kills Python on the spot, so a capture in progress loses every measured
step and leaves a Run that says ``running`` forever. :func:`signals_as_interrupts` turns
them into :class:`Terminated`, a :class:`KeyboardInterrupt`, so the code that keeps a
Run on Ctrl-C (status ``interrupted``, tables written) keeps it on these too. The
signal is first passed on to this process's children (a script's worker processes, a
launcher's ranks), as a shell would.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

TERMINATION_SIGNALS: tuple[signal.Signals, ...] = tuple(
    s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s is not None
)


class Terminated(KeyboardInterrupt):
    """A termination signal received while a job ran; ``exit_code`` is 128 + the signal."""

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        super().__init__(f"received {signal.Signals(self.signum).name}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def interrupt_exit_code(exc: BaseException) -> int:
    """The exit code a process stopped by ``exc`` should report (130 for Ctrl-C)."""
    return exc.exit_code if isinstance(exc, Terminated) else 130


def forward_to_children(signum: int) -> int:
    """Send ``signum`` to this process's direct children; how many were signalled."""
    try:
        import psutil

        children = psutil.Process().children(recursive=False)
    except Exception:  # no psutil view of this process: nothing we can forward to
        return 0
    sent = 0
    for child in children:
        try:
            child.send_signal(signum)
            sent += 1
        except Exception:  # it exited meanwhile, or is not ours to signal
            continue
    return sent


_held: list[bool] = []


@contextlib.contextmanager
def hold_interrupts() -> Iterator[None]:
    """Termination signals that arrive inside the block do not interrupt it (a Run being
    written after the first signal is not lost to a second one)."""
    _held.append(True)
    try:
        yield
    finally:
        _held.pop()


@contextlib.contextmanager
def signals_as_interrupts(signals: tuple[signal.Signals, ...] = TERMINATION_SIGNALS) -> Iterator[None]:
    """While the block runs, ``signals`` raise :class:`Terminated` in the main thread.

    Outside the main thread (where Python cannot install handlers) the block runs
    unchanged. Handlers are restored on the way out.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        forward_to_children(signum)
        if _held:  # a Run is being saved: finish that first, the job ends right after
            return
        raise Terminated(signum)

    previous = {}
    for s in signals:
        try:
            previous[s] = signal.signal(s, handler)
        except (OSError, ValueError):  # not installable here: leave it as it was
            continue
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)

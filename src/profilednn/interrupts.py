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
from typing import Callable, Iterator

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


def system_exit_code(exc: SystemExit) -> int:
    """The exit code a process reports for ``sys.exit(code)``, as Python computes it: 0 for
    None, the number for an int, 1 for anything else (Python prints it)."""
    if exc.code is None:
        return 0
    return exc.code if isinstance(exc.code, int) else 1


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
_deferred: list[list[int]] = []  # per open deferred_interrupts block: the signals it caught


@contextlib.contextmanager
def hold_interrupts() -> Iterator[None]:
    """Termination signals that arrive inside the block do not interrupt it (a Run being
    written after the first signal is not lost to a second one)."""
    _held.append(True)
    try:
        yield
    finally:
        _held.pop()


def interrupt_for(signum: int) -> KeyboardInterrupt:
    """The exception ``signum`` raises in a job: KeyboardInterrupt for SIGINT (Ctrl-C),
    :class:`Terminated` for a termination signal."""
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


def _catch_sigint(pending: list[int]) -> Callable[[], None]:
    """While deferring, Ctrl-C is noted in ``pending`` instead of raised; the undo. Only
    where Python's own Ctrl-C handler is installed (a handler of the caller's is kept)."""
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return lambda: None
    signal.signal(signal.SIGINT, lambda signum, frame: pending.append(signum))
    return lambda: signal.signal(signal.SIGINT, signal.default_int_handler)


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Ctrl-C and termination signals that arrive inside the block interrupt the job as the
    block ends, not in its middle: writes that must agree with each other (a Run's tables and
    the manifest that says how far the job got) land together. Unlike :func:`hold_interrupts`
    the signal is not dropped: it is raised on the way out (an error the block raised stays
    attached as its ``__context__``); a block inside another passes it to the outer one.
    Outside the main thread, where no signal handler runs, the block runs unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    _deferred.append(pending)
    restore_sigint = _catch_sigint(pending)
    try:
        yield
    finally:
        restore_sigint()
        _deferred.pop()
        if pending and _deferred:
            _deferred[-1].extend(pending)
        elif pending:
            raise interrupt_for(pending[0])


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
        if _deferred:  # writes that belong together are under way: raised as they end
            _deferred[-1].append(signum)
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

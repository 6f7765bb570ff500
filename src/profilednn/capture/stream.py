"""Capture oneDNN's verbose stream at the file descriptor, with markers in the same stream.

oneDNN prints verbose lines with C stdio to file descriptor 1. While a capture window is
open, fd 1 points straight at the log file (no pipe, no reader thread, so nothing competes
with the workload for the GIL), and Python's ``sys.stdout`` is rebound to the terminal so
the workload's own prints still reach the user. Marker lines (``verbose/markers.py``) written
with ``os.write`` to fd 1 land in the log in exact order with the primitives around them.

Output that C code or child processes started by exec write to fd 1 during the window also
lands in the log; ``forward_foreign_lines`` sends it on to the terminal afterwards, so
nothing the workload prints is lost and none of it enters the tables. A forked child (a
DataLoader worker) gets fd 1 back on the terminal (``capture/forks.py``).
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import tempfile
import os
import sys
from pathlib import Path
from typing import Iterator, TextIO

from ..verbose.markers import is_marker_line
from .forks import leave_forked_children

VERBOSE_PREFIXES = ("onednn_verbose", "dnnl_verbose", "mkldnn_verbose")

try:
    _libc = ctypes.CDLL(None)
    _fflush = _libc.fflush
    _fflush.argtypes = [ctypes.c_void_p]
except (OSError, AttributeError):  # pragma: no cover - non-glibc platforms
    _fflush = None


def flush_c_stdio() -> None:
    """Flush every C stdio buffer so nothing oneDNN printed is left behind."""
    if _fflush is not None:
        _fflush(None)


class VerboseTap:
    """Point fd 1 at ``log_path`` while open; keep Python's stdout on the terminal."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = Path(log_path)
        self._saved_fd: int | None = None
        self._saved_stdout: TextIO | None = None
        self._python_stdout: TextIO | None = None
        self.is_open = False
        leave_forked_children(self)

    def in_forked_child(self) -> None:
        """A forked child (a DataLoader worker) writes to the terminal, not into the log:
        nothing it prints or runs enters the parent's tables (``capture/forks.py``)."""
        if self.is_open and self._saved_fd is not None:
            os.dup2(self._saved_fd, 1)
            self.is_open = False  # the parent closes the tap; the child's copy is done

    def open(self) -> None:
        if self.is_open:
            return
        sys.stdout.flush()
        flush_c_stdio()
        self._saved_fd = os.dup(1)
        log_fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.dup2(log_fd, 1)
        finally:
            os.close(log_fd)
        # Rebind Python-level stdout to the terminal only when it is the real fd 1
        # (pytest and other tools install their own objects; leave those alone).
        if _writes_to_fd1(sys.stdout):
            self._saved_stdout = sys.stdout
            self._python_stdout = io.TextIOWrapper(
                os.fdopen(os.dup(self._saved_fd), "wb", buffering=0),
                encoding=getattr(sys.stdout, "encoding", None) or "utf-8",
                errors="replace",
                line_buffering=True,
                write_through=True,
            )
            sys.stdout = self._python_stdout
        self.is_open = True

    def close(self) -> None:
        if not self.is_open:
            return
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass
        flush_c_stdio()
        assert self._saved_fd is not None
        os.dup2(self._saved_fd, 1)
        os.close(self._saved_fd)
        self._saved_fd = None
        if self._saved_stdout is not None:
            sys.stdout = self._saved_stdout
            self._saved_stdout = None
        if self._python_stdout is not None:
            self._python_stdout.close()
            self._python_stdout = None
        self.is_open = False

    def __enter__(self) -> "VerboseTap":
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _writes_to_fd1(stream: object) -> bool:
    try:
        return stream.fileno() == 1  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return False


# Lines the CPU-only use of a CUDA build of torch.profiler prints on every start/stop.
_PROFILER_NOISE = ("USDT:", "gpuGetDeviceCount failed", "SyncActivityProfilerHandler",
                   "Memory block of unknown size")


@contextlib.contextmanager
def quiet_profiler_noise() -> Iterator[None]:
    """Hide kineto's start/stop chatter on fd 2; pass every other line through."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            flush_c_stdio()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            for raw in tmp.read().decode("utf-8", "replace").splitlines(keepends=True):
                if not any(n in raw for n in _PROFILER_NOISE):
                    sys.stderr.write(raw)
            sys.stderr.flush()


def forward_foreign_lines(log_path: Path, out: TextIO | None = None) -> int:
    """Send lines of the log that are neither verbose nor markers to ``out``; count them."""
    out = out or sys.stdout
    n = 0
    with open(log_path, "r", encoding="utf-8", errors="replace", newline="") as fh:
        for line in fh:
            if line.startswith(VERBOSE_PREFIXES) or is_marker_line(line):
                continue
            out.write(line)
            n += 1
    if n:
        out.flush()
    return n

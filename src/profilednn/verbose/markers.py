"""ProfileDNN's marker lines: the one format, its writer and its reader.

A marker is a line ProfileDNN writes into oneDNN's verbose stream (file descriptor 1)
so that it lands in exact order with the primitive lines around it:

    profilednn_mark,<unix ms>,<event>[,<arg>...]

Capture writes one at every step, phase, module and span boundary (``capture/hooks.py``,
``capture/session.py``) and attributes primitives to them (``capture/attribute.py``); the
projection's replay worker brackets each timed case with ``replay`` markers
(``replay,<case>@<attempt>,timed`` ... ``replay,<case>@<attempt>,end``). The verbose
parser counts marker lines and skips them (``scan.py``; ``scan_lines.c`` spells the
same prefix in C). Nothing here imports PyTorch.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

MARK_PREFIX = "profilednn_mark"
# The bytes a marker line starts with (the prefix and its comma).
MARK_LINE_PREFIX = (MARK_PREFIX + ",").encode()
# The event of the replay worker's markers.
REPLAY_EVENT = "replay"

# Capture's events (``capture/hooks.py`` and ``capture/session.py`` write them,
# ``capture/attribute.py`` reads them), each with the arguments it carries.
WIN_OPEN = "win_open"              # ,<step>: the measured window opens
WIN_CLOSE = "win_close"            # the measured window closes
STEP_END = "step_end"              # ,<step>: a training step ends
FWD_BEGIN = "fwd_begin"            # ,<depth>,<module>: a module's forward starts
FWD_END = "fwd_end"                # ,<depth>,<module>: ... and ends
LOSS_BEGIN = "loss_begin"          # ,<depth>,<module>: the loss module's forward starts
LOSS_END = "loss_end"              # ,<depth>,<module>: ... and ends
BACKWARD_BEGIN = "backward_begin"  # the backward pass starts (torch.autograd.backward)
BACKWARD_END = "backward_end"      # ... and ends
BWD_BEGIN = "bwd_begin"            # ,<module>: a module's backward starts
BWD_END = "bwd_end"                # ,<module>: ... and ends
OPT_BEGIN = "opt_begin"            # ,step or ,zero_grad: the optimizer starts
OPT_END = "opt_end"                # ,step or ,zero_grad: ... and ends
OPT_STEP = "step"                  # the optimizer markers' argument for optimizer.step()
OPT_ZERO_GRAD = "zero_grad"        # ... and for optimizer.zero_grad()
EVAL_BEGIN = "eval_begin"          # ,<module>: an evaluation call starts
EVAL_END = "eval_end"              # ,<module>: ... and ends
PHASE_BEGIN = "phase_begin"        # ,<phase>: an explicit phase (``cap.phase("data")``) starts
PHASE_END = "phase_end"            # ,<phase>: ... and ends
CAPTURE_EVENTS: tuple[str, ...] = (
    WIN_OPEN, WIN_CLOSE, STEP_END, FWD_BEGIN, FWD_END, LOSS_BEGIN, LOSS_END, BACKWARD_BEGIN, BACKWARD_END,
    BWD_BEGIN, BWD_END, OPT_BEGIN, OPT_END, EVAL_BEGIN, EVAL_END, PHASE_BEGIN, PHASE_END,
)
"""Every event capture writes (the replay worker's is ``REPLAY_EVENT``)."""


@dataclass
class Marker:
    """One marker line of a log: its 1-based line number, Unix time (ms), event, arguments."""

    line: int
    time_ms: float
    event: str
    args: list[str]


def format_marker(fields: str, time_ms: float | None = None) -> bytes:
    """The marker line for ``fields`` (``"<event>,<arg>,..."``), stamped now unless given."""
    stamp = time.time() * 1000.0 if time_ms is None else time_ms
    return f"{MARK_PREFIX},{stamp:.3f},{fields}\n".encode()


def write_marker(fields: str, fd: int = 1) -> None:
    """Write one marker line into ``fd`` (the verbose stream, fd 1, by default) with one
    unbuffered ``os.write``, so it lands after every line already written there."""
    os.write(fd, format_marker(fields))


def is_marker_line(line: str | bytes) -> bool:
    """Whether ``line`` is a marker line."""
    if isinstance(line, bytes):
        return line.startswith(MARK_LINE_PREFIX)
    return line.startswith(MARK_PREFIX + ",")


def read_markers(log_path: Path, event: str | None = None) -> list[Marker]:
    """Every marker line of a log (only ``event``'s when given), with its line number.
    A line with the prefix but no readable time is not a marker and is skipped."""
    out: list[Marker] = []
    with open(log_path, "rb") as fh:
        for i, raw in enumerate(fh, 1):
            if not raw.startswith(MARK_LINE_PREFIX):
                continue
            parts = raw.decode("utf-8", "replace").rstrip("\r\n").split(",")
            if len(parts) < 3 or (event is not None and parts[2] != event):
                continue
            try:
                t = float(parts[1])
            except ValueError:
                continue
            out.append(Marker(i, t, parts[2], parts[3:]))
    return out


__all__ = ["BACKWARD_BEGIN", "BACKWARD_END", "BWD_BEGIN", "BWD_END", "CAPTURE_EVENTS", "EVAL_BEGIN", "EVAL_END",
           "FWD_BEGIN", "FWD_END", "LOSS_BEGIN", "LOSS_END", "MARK_LINE_PREFIX", "MARK_PREFIX", "OPT_BEGIN", "OPT_END",
           "OPT_STEP", "OPT_ZERO_GRAD",
           "PHASE_BEGIN", "PHASE_END", "REPLAY_EVENT", "STEP_END", "WIN_CLOSE", "WIN_OPEN", "Marker", "format_marker",
           "is_marker_line", "read_markers", "write_marker"]

"""ProfileDNN's marker lines: the one format, its writer and its reader.

A marker is a line ProfileDNN writes into oneDNN's verbose stream (file descriptor 1)
so that it lands in exact order with the primitive lines around it:

    profilednn_mark,<unix ms>,<event>[,<arg>...][,pf=<minor faults>]

Capture writes one at every step, phase, module and span boundary (``capture/hooks.py``,
``capture/session.py``) and attributes primitives to them (``capture/attribute.py``); the
projection's replay worker brackets each timed case with ``replay`` markers
(``replay,<case>@<attempt>,timed`` ... ``replay,<case>@<attempt>,end``). The verbose
parser counts marker lines and skips them (``scan.py``; ``scan_lines.c`` spells the
same prefix in C). Capture's markers end with the process's minor page-fault count
(``pf=``), so a span's faults are its end's count less its start's. Nothing here imports
PyTorch.
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
    """One marker line of a log: its 1-based line number, Unix time (ms), event, arguments
    and the process's minor page faults when it was written (None: not counted)."""

    line: int
    time_ms: float
    event: str
    args: list[str]
    faults: int | None = None


FAULTS_FIELD = "pf="
"""The prefix of a marker's last field when it carries the process's minor page faults."""


def format_marker(fields: str, time_ms: float | None = None, faults: int | None = None) -> bytes:
    """The marker line for ``fields`` (``"<event>,<arg>,..."``), stamped now unless given,
    ending with ``pf=<faults>`` when ``faults`` is given."""
    stamp = time.time() * 1000.0 if time_ms is None else time_ms
    tail = "" if faults is None else f",{FAULTS_FIELD}{faults}"
    return f"{MARK_PREFIX},{stamp:.3f},{fields}{tail}\n".encode()


def write_marker(fields: str, fd: int = 1, faults: int | None = None) -> None:
    """Write one marker line into ``fd`` (the verbose stream, fd 1, by default) with one
    unbuffered ``os.write``, so it lands after every line already written there."""
    os.write(fd, format_marker(fields, faults=faults))


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
            args, faults = parts[3:], None
            if args and args[-1].startswith(FAULTS_FIELD):
                try:
                    faults = int(args[-1][len(FAULTS_FIELD):])
                    args = args[:-1]
                except ValueError:
                    pass  # a module named "pf=..." keeps its name: the field is not a count
            out.append(Marker(i, t, parts[2], args, faults))
    return out


__all__ = ["BACKWARD_BEGIN", "BACKWARD_END", "BWD_BEGIN", "BWD_END", "CAPTURE_EVENTS", "EVAL_BEGIN", "EVAL_END",
           "FAULTS_FIELD", "FWD_BEGIN", "FWD_END", "LOSS_BEGIN", "LOSS_END", "MARK_LINE_PREFIX", "MARK_PREFIX", "OPT_BEGIN", "OPT_END",
           "OPT_STEP", "OPT_ZERO_GRAD",
           "PHASE_BEGIN", "PHASE_END", "REPLAY_EVENT", "STEP_END", "WIN_CLOSE", "WIN_OPEN", "Marker", "format_marker",
           "is_marker_line", "read_markers", "write_marker"]

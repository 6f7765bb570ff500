"""The user's script as ``python train.py ARGS`` names it, and its traceback without ours.

Read by every process that runs a user's script (a capture, an optimize arm, a rank of a
launched job); it imports nothing heavy, so an arm's start-up pays for torch and the
script, not for the capture's tables.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Any, TextIO

from ..errors import ProfileDNNError


def _script_path(argv: list[str]) -> tuple[Path | None, str | None, list[str]]:
    """Split ``python train.py ARGS`` / ``train.py ARGS`` / ``python -m pkg ARGS``."""
    if not argv:
        raise ProfileDNNError("give the script to profile after `--`, e.g. "
                              "`profilednn profile -- python train.py`")
    args = list(argv)
    first = os.path.basename(args[0])
    if first.startswith("python") or os.path.abspath(args[0]) == os.path.abspath(sys.executable):
        args = args[1:]
        while args and args[0].startswith("-") and args[0] != "-m":
            args = args[1:]  # interpreter flags such as -u
    if not args:
        raise ProfileDNNError("no script given after the interpreter")
    if args[0] == "-m":
        if len(args) < 2:
            raise ProfileDNNError("`-m` needs a module name")
        return None, args[1], args[2:]
    path = Path(args[0])
    if not path.is_file():
        raise ProfileDNNError(f"script not found: {path}")
    return path, None, args[1:]


def script_target(argv: list[str]) -> tuple[Path | None, str | None, list[str]]:
    """``(path, module, args)`` of ``python train.py ARGS`` / ``train.py ARGS`` / ``python -m
    pkg ARGS``: exactly one of path and module is set. Raises ``ProfileDNNError`` with a
    one-line reason when no script is given or the file does not exist."""
    return _script_path(argv)


def _is_runner_frame(frame: Any) -> bool:
    module = str(frame.f_globals.get("__name__", ""))
    return module == "runpy" or module == "profilednn" or module.startswith("profilednn.")


def script_traceback(exc: BaseException) -> str:
    """The script's traceback as Python prints it, without our own frames."""
    tb = exc.__traceback__
    while tb is not None and _is_runner_frame(tb.tb_frame):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))


def print_script_traceback(exc: BaseException, file: TextIO | None = None) -> None:
    """Print the script's traceback to stderr as Python would, without our own frames."""
    out = file or sys.stderr
    out.write(script_traceback(exc))
    out.flush()


__all__ = ["print_script_traceback", "script_target", "script_traceback"]

"""How a long job reports progress: one line at a time to a callable (the CLI's live
display, ``print`` from the Python API, or ``None`` for silence)."""

from __future__ import annotations

from collections.abc import Callable

Progress = Callable[[str], None]

__all__ = ["Progress"]

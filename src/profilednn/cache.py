"""Where ProfileDNN keeps what it measures or builds once per machine (machine profiles,
compiled kernels): ``$PROFILEDNN_CACHE_DIR``, else ``$XDG_CACHE_HOME/profilednn``, else
``~/.cache/profilednn``."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$PROFILEDNN_CACHE_DIR`` or ``~/.cache/profilednn``."""
    env = os.environ.get("PROFILEDNN_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "profilednn"


__all__ = ["cache_dir"]

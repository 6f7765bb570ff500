"""Atomic file writes: every write goes to a temporary name in the same directory and is
renamed into place, so a crash never leaves a half-written file behind.

The lowest layer: it imports nothing of ProfileDNN, so every package may use it.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

import polars as pl


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_target(path: Path) -> Iterator[str]:
    """Yield a temporary name beside ``path``; on success it replaces ``path``.

    The temporary file gets ordinary permissions (``mkstemp`` makes it 0600); on any
    error it is removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename."""
    with atomic_target(path) as tmp, open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def atomic_write_parquet(path: Path, df: pl.DataFrame) -> None:
    """Write a polars DataFrame as Parquet, atomically."""
    with atomic_target(path) as tmp:
        df.write_parquet(tmp)


__all__ = ["atomic_target", "atomic_write_bytes", "atomic_write_json", "atomic_write_parquet", "atomic_write_text"]

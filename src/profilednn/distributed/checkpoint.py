"""Training checkpoints: written atomically, found again after a restart.

A checkpoint is ``step-NNNNNNNN.pt`` (``torch.save`` of a dict) holding the number of
completed steps, the model and optimizer state and the job's data settings. It is
written to a temporary name and renamed, so a rank killed mid-write never leaves a
torn file; the newest complete one is the one a restarted job resumes from. Only the
last ``keep`` are kept.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

import torch

from ..errors import InputError
from ..run import atomic_target

_NAME = re.compile(r"^step-(\d{8})\.pt$")


def checkpoint_path(directory: Path, step: int) -> Path:
    return Path(directory) / f"step-{step:08d}.pt"


def list_checkpoints(directory: Path | str) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint in ``directory``, oldest first."""
    d = Path(directory)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if (m := _NAME.match(p.name))]
    return sorted(found)


def latest_checkpoint(directory: Path | str) -> Path | None:
    found = list_checkpoints(directory)
    return found[-1][1] if found else None


def save_checkpoint(directory: Path | str, step: int, state: dict[str, Any], keep: int = 2) -> Path:
    """Write ``state`` (with ``step``) atomically; prune all but the newest ``keep``."""
    path = checkpoint_path(Path(directory), step)
    with atomic_target(path) as tmp:
        torch.save({**state, "step": step}, tmp)
    for _, old in list_checkpoints(directory)[:-keep] if keep > 0 else []:
        old.unlink(missing_ok=True)
    return path


def load_checkpoint(path: Path | str) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (tensors on the CPU)."""
    p = Path(path)
    try:
        state = torch.load(p, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as exc:
        raise InputError(f"cannot read checkpoint {p}: {exc}") from exc
    if not isinstance(state, dict) or "step" not in state:
        raise InputError(f"{p} is not a ProfileDNN checkpoint (no 'step')")
    return state


__all__ = ["checkpoint_path", "latest_checkpoint", "list_checkpoints", "load_checkpoint", "save_checkpoint"]

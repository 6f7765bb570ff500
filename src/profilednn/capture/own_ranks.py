"""A script that starts ranks of its own: its process group is bigger than the job the
process was started in. Lightning's ``Trainer(strategy="ddp", devices=N)`` does this when
no launcher started it: it sets the rank variables in its own environment and re-runs the
script for ranks 1..N-1, which ProfileDNN never sees. ``profile`` keeps its Run of this
process and says so in a note; ``optimize`` refuses such a script (``script/runner.py``)."""

from __future__ import annotations

import os


def launched_world_size() -> int | None:
    """The ``WORLD_SIZE`` this process was started with (torchrun's, or another launcher's;
    None: it was started alone). Read it before the script runs: a script that starts its
    own ranks sets it in its own environment first."""
    value = os.environ.get("WORLD_SIZE", "")
    return int(value) if value.isdigit() else None


def started_own_ranks(world: int | None, launched: int | None) -> str | None:
    """Why a process group of ``world`` ranks in a process started as one of ``launched``
    (None: alone) is the script's own (None: it is not)."""
    if (world or 0) <= (launched or 1):
        return None
    return (f"the script started processes of its own: its process group has {world} ranks, but it was started as "
            f"{'one process' if not launched else f'one of {launched} ranks'} (Lightning's Trainer(strategy=\"ddp\", "
            f"devices={world}) re-runs the script for its other ranks when no launcher started it)")


def own_ranks_note(launched: int | None) -> str | None:
    """The profile's note when the script's process group outgrew the job it was started in
    (``launched``: ``launched_world_size()`` before it ran); None otherwise."""
    import torch.distributed as dist

    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else None
    reason = started_own_ranks(world, launched)
    if reason is None:
        return None
    return (f"{reason}: this Run profiles this process only, the other ranks ran unobserved. `profilednn scale "
            f"--ranks {world} -- ...` and `profilednn optimize --nproc-per-node {world} -- ...` launch every rank "
            "themselves (Lightning then starts none)")


__all__ = ["launched_world_size", "own_ranks_note", "started_own_ranks"]

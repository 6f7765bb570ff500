"""What ProfileDNN installs into a process stays in that process.

A DataLoader worker forked from a profiled script inherits the parent's memory: the global
module hooks, the capture's state, and file descriptor 1, which points at the verbose log
while a capture window is open. Left alone, the worker's transforms (torchvision's are
``nn.Module``s) wrote markers into the parent's log and became "layers" of the training
step (timm's ``train.py``: ``ColorJitter`` at 13% of a ResNet-50 step), and the worker's
nesting interleaved with the step's. Objects registered here are told, in every process
forked from this one, that they are in a forked child, before the child runs its own code;
there they take themselves out, so the worker runs as it would unprofiled.

A worker started by ``spawn`` or ``forkserver`` is a fresh interpreter: it gets no hooks,
only the file descriptors (see ``capture/stream.py`` for what its output does).
"""

from __future__ import annotations

import os
import sys
import traceback
import weakref
from typing import Protocol


class LeavesForkedChildren(Protocol):
    def in_forked_child(self) -> None:
        """Undo, in this forked child, what was installed in the parent."""


_registered: "weakref.WeakSet[LeavesForkedChildren]" = weakref.WeakSet()


def leave_forked_children(obj: LeavesForkedChildren) -> None:
    """Have ``obj.in_forked_child()`` called in every process forked while ``obj`` lives."""
    _registered.add(obj)


def _after_fork_in_child() -> None:
    for obj in list(_registered):
        try:
            obj.in_forked_child()
        except Exception:  # the child has no Run to note it in: say it on its stderr, go on
            sys.stderr.write("profilednn: could not take its instrumentation out of a forked child:\n"
                             + traceback.format_exc())
    _registered.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)

__all__ = ["LeavesForkedChildren", "leave_forked_children"]

"""Memory the kernel must fault in afresh: a test's known count of minor page faults."""

from __future__ import annotations

import mmap

import numpy as np


def touch_fresh_memory(nbytes: int) -> None:
    """Fill a freshly mapped anonymous region of ``nbytes`` (not malloc: a long-lived test
    process may hold a free heap hole that big), so each of its 4 KiB pages faults once."""
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):  # 4 KiB pages even where THP is "always"
        region.madvise(mmap.MADV_NOHUGEPAGE)
    view = np.frombuffer(region, dtype=np.uint8)
    view.fill(1)
    del view
    region.close()

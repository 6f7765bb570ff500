"""Whether a process a test started has ended."""

from __future__ import annotations

import os
import time


def gone_within(pid: int, within_s: float) -> bool:
    """True once ``pid`` no longer exists, polled until ``within_s`` seconds have passed."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False

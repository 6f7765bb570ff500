"""Run a training workload under observation and write a Run.

oneDNN reads ``ONEDNN_VERBOSE_TIMESTAMP`` once, when it first initialises; capture sets
it on import (unless the user chose otherwise) so primitive lines carry Unix-clock
timestamps that line up with the profiler and the markers.
"""

from __future__ import annotations

import os

os.environ.setdefault("ONEDNN_VERBOSE_TIMESTAMP", "1")

from .._lazy import lazy_getattr  # noqa: E402

__all__ = ["Capture", "CaptureSession", "capture", "profile_builtin", "profile_script"]

# loaded on first use: a process that needs only the hooks (an optimize arm, a rank) does not
# import the session, the Run and its tables
__getattr__ = lazy_getattr(__name__, {"Capture": ".runners", "capture": ".runners", "profile_builtin": ".runners",
                                      "profile_script": ".runners", "CaptureSession": ".session"})

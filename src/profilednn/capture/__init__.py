"""Run a training workload under observation and write a Run.

oneDNN reads ``ONEDNN_VERBOSE_TIMESTAMP`` once, when it first initialises; capture sets
it on import (unless the user chose otherwise) so primitive lines carry Unix-clock
timestamps that line up with the profiler and the markers.
"""

from __future__ import annotations

import os

os.environ.setdefault("ONEDNN_VERBOSE_TIMESTAMP", "1")

from .runners import Capture, capture, profile_builtin, profile_script  # noqa: E402
from .session import CaptureSession  # noqa: E402

__all__ = ["Capture", "CaptureSession", "capture", "profile_builtin", "profile_script"]

"""The verbose job's Python API: what ``profilednn parse`` / ``breakdown`` call, and what
``profilednn`` exports (``read_log``, ``breakdown``). Knows nothing of PyTorch."""

from __future__ import annotations

from .benchdnn import batch_lines, format_batch, write_batch
from .breakdown import DEFAULT_KEYS, breakdown, check_keys
from .reader import VerboseLog, no_primitives_error, read_log, read_log_with_report, scan_log

__all__ = ["DEFAULT_KEYS", "VerboseLog", "batch_lines", "breakdown", "check_keys", "format_batch",
           "no_primitives_error", "read_log", "read_log_with_report", "scan_log", "write_batch"]

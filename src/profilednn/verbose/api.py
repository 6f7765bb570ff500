"""The verbose job's Python API: what ``profilednn parse`` / ``breakdown`` call, and what
``profilednn`` exports (``read_log``, ``breakdown``). Knows nothing of PyTorch.

Names load on first use, so ``profilednn breakdown`` (``scan_totals``, ``breakdown``)
starts without polars or NumPy."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr

if TYPE_CHECKING:
    from .benchdnn import batch_lines, format_batch, write_batch
    from .breakdown import DEFAULT_KEYS, breakdown, breakdown_csv, check_keys
    from .reader import VerboseLog, no_primitives_error, read_log, read_log_with_report, scan_log
    from .totals import LogTotals, scan_totals

__getattr__ = lazy_getattr(__name__, {
    **dict.fromkeys(("batch_lines", "format_batch", "write_batch"), "profilednn.verbose.benchdnn"),
    **dict.fromkeys(("DEFAULT_KEYS", "breakdown", "breakdown_csv", "check_keys"), "profilednn.verbose.breakdown"),
    **dict.fromkeys(("VerboseLog", "no_primitives_error", "read_log", "read_log_with_report", "scan_log"),
                    "profilednn.verbose.reader"),
    **dict.fromkeys(("LogTotals", "scan_totals"), "profilednn.verbose.totals"),
})

__all__ = ["DEFAULT_KEYS", "LogTotals", "VerboseLog", "batch_lines", "breakdown", "breakdown_csv", "check_keys",
           "format_batch", "no_primitives_error", "read_log", "read_log_with_report", "scan_log", "scan_totals",
           "write_batch"]

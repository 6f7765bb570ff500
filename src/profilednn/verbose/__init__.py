"""oneDNN verbose logs: detect the dialect, parse, decode problems, write benchdnn batches.

Knows nothing of PyTorch: text in, tables (polars) and text out.

* :func:`read_log` -- a log (path, ``-``, gzip, bytes or lines) -> the primitive table
  (:data:`~profilednn.verbose.schema.PRIMITIVE_SCHEMA`);
* :func:`read_log_with_report` -- the same plus a :class:`ParseReport`;
* :func:`scan_log` -- the lean form (:class:`VerboseLog`) for huge logs;
* :func:`scan_totals` -- per-shape calls and time in one pass (:class:`LogTotals`),
  what :func:`breakdown` needs;
* :func:`breakdown` -- calls / time / share / average per group;
* :func:`write_batch`, :func:`batch_lines`, :func:`parse_batch` -- benchdnn batch files;
* :func:`decode_problem`, :func:`encode_problem` -- benchdnn problem descriptors.

Table rows are ``exec`` lines and every ``create*`` event (``create:cache_miss``,
``create:cache_hit``, ``create_nested:*`` ...), each with its time. ``create:check``,
``create:dispatch`` and ``exec:check`` lines are diagnostics -- argument checks and
implementations that were *rejected* -- without a timing, so they are counted
(``ParseReport.counts["dispatch"]``) but never rows, even when they print a full
primitive descriptor. Info/template, graph-API, error/warning lines, ProfileDNN's own
``profilednn_mark,`` lines and program output are counted and skipped; primitive-looking
lines that cannot be read are counted as malformed with their line numbers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr

# Eager (and free of polars): the function must shadow its module's name on the package.
from .breakdown import DEFAULT_KEYS, breakdown

if TYPE_CHECKING:
    from .benchdnn import BatchLine, batch_lines, benchdnn_line, format_batch, parse_batch, write_batch
    from .dialects import DIALECTS, LINE_CLASSES
    from .problem import Problem, ProblemError, decode_problem, encode_problem
    from .reader import VerboseLog, read_log, read_log_with_report, scan_log
    from .report import LineIssue, ParseReport
    from .schema import (
        CAPTURE_COLUMNS, CAPTURE_SCHEMA, CONV_FIELDS, DIRECTIONS, DRIVERS, PRIMITIVE_COLUMNS,
        PRIMITIVE_SCHEMA, empty_primitives,
    )
    from .totals import LogTotals, scan_totals

# Loaded on first use: the one-pass breakdown (totals.py) runs without polars or NumPy.
_LAZY = {
    **dict.fromkeys(("BatchLine", "batch_lines", "benchdnn_line", "format_batch", "parse_batch", "write_batch"),
                    ".benchdnn"),
    **dict.fromkeys(("DIALECTS", "LINE_CLASSES"), ".dialects"),
    **dict.fromkeys(("Problem", "ProblemError", "decode_problem", "encode_problem"), ".problem"),
    **dict.fromkeys(("VerboseLog", "read_log", "read_log_with_report", "scan_log"), ".reader"),
    **dict.fromkeys(("LineIssue", "ParseReport"), ".report"),
    **dict.fromkeys(("CAPTURE_COLUMNS", "CAPTURE_SCHEMA", "CONV_FIELDS", "DIRECTIONS", "DRIVERS",
                     "PRIMITIVE_COLUMNS", "PRIMITIVE_SCHEMA", "empty_primitives"), ".schema"),
    **dict.fromkeys(("LogTotals", "scan_totals"), ".totals"),
}

__getattr__ = lazy_getattr(__name__, _LAZY)

__all__ = [
    "BatchLine",
    "CAPTURE_COLUMNS",
    "CAPTURE_SCHEMA",
    "CONV_FIELDS",
    "DEFAULT_KEYS",
    "DIALECTS",
    "DIRECTIONS",
    "DRIVERS",
    "LINE_CLASSES",
    "LineIssue",
    "LogTotals",
    "PRIMITIVE_COLUMNS",
    "PRIMITIVE_SCHEMA",
    "ParseReport",
    "Problem",
    "ProblemError",
    "VerboseLog",
    "batch_lines",
    "benchdnn_line",
    "breakdown",
    "decode_problem",
    "empty_primitives",
    "encode_problem",
    "format_batch",
    "parse_batch",
    "read_log",
    "read_log_with_report",
    "scan_log",
    "scan_totals",
    "write_batch",
]

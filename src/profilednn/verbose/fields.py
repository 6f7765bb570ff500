"""Column names of the primitive table, importable without polars.

:mod:`.schema` gives their polars types (``PRIMITIVE_SCHEMA``, in the same order; a test
keeps the two in step). The decoder and the one-pass breakdown (:mod:`.totals`) need
only the names, so ``profilednn breakdown`` never has to load polars.
"""

from __future__ import annotations

# Decoded convolution / deconvolution / pooling fields (benchdnn names). Right/bottom
# padding (``*_r``) is derived the way benchdnn derives it when the log omits it.
CONV_FIELDS: tuple[str, ...] = (
    "mb", "g", "ic", "oc",
    "id", "ih", "iw",
    "od", "oh", "ow",
    "kd", "kh", "kw",
    "sd", "sh", "sw",
    "dd", "dh", "dw",
    "pd", "ph", "pw",
    "pd_r", "ph_r", "pw_r",
)

PRIMITIVE_COLUMN_NAMES: tuple[str, ...] = (
    "line", "dialect", "event", "engine", "driver", "prim_kind", "impl", "isa", "prop_kind", "direction",
    "cfg", "src_dt", "wei_dt", "dst_dt", "src_tag", "wei_tag", "dst_tag", "mds", "attrs", "aux",
    "post_ops", "alg", "problem", *CONV_FIELDS, "m", "n", "k", "batch", "dims",
    "time_ms", "timestamp_ms", "flops", "flops_dense", "bytes",
)

# Columns each line sets itself; every other column is fixed by the line's shape.
PER_LINE_COLUMNS: tuple[str, ...] = ("line", "time_ms", "timestamp_ms")

# Columns of float and integer type (``PRIMITIVE_SCHEMA``: Float64, Int64); the rest are strings.
FLOAT_COLUMNS: frozenset[str] = frozenset(("time_ms", "timestamp_ms", "flops", "flops_dense", "bytes"))
INT_COLUMNS: frozenset[str] = frozenset(("line", *CONV_FIELDS, "m", "n", "k", "batch"))

"""The primitive table's columns: the contract between the parser and every job.

One row per oneDNN verbose primitive line (``exec`` or a ``create:*`` event). Columns
follow seed 000's Table 2 (benchdnn's problem parameters) plus what projection needs.
Capture adds ``op``, ``module``, ``phase`` and ``step`` (see ``CAPTURE_COLUMNS``).
"""

from __future__ import annotations

import polars as pl

from .fields import CONV_FIELDS  # the names, importable without polars (fields.py)

PRIMITIVE_SCHEMA: dict[str, pl.DataType] = {
    "line": pl.Int64,            # 1-based line number in the log
    "dialect": pl.Utf8,          # mkldnn_v0 | dnnl_v1 | onednn_v2.5 | onednn_v3.2 | onednn_v3.3 | onednn_v3.6
    "event": pl.Utf8,            # exec | create:cache_miss | create:cache_hit | create:check | create:dispatch | ...
    "engine": pl.Utf8,           # cpu | gpu:0 | ...
    "driver": pl.Utf8,           # benchdnn driver: conv, deconv, ip, matmul, eltwise, bnorm, ...
    "prim_kind": pl.Utf8,        # as printed: convolution, inner_product, reorder, ...
    "impl": pl.Utf8,             # implementation name as printed: brg_conv_fwd:avx2, jit:avx2, ...
    "isa": pl.Utf8,              # ISA derived from impl: avx2, avx512_core, avx512_core_amx, sse41, any
    "prop_kind": pl.Utf8,        # forward_training | forward_inference | backward_data | backward_weights | backward | undef
    "direction": pl.Utf8,        # benchdnn dir: FWD_D FWD_B FWD_I BWD_D BWD_W BWD_WB BWD_DW
    "cfg": pl.Utf8,              # benchdnn cfg / dt: f32, bf16bf16f32, u8s8u8, ...
    "src_dt": pl.Utf8,
    "wei_dt": pl.Utf8,
    "dst_dt": pl.Utf8,
    "src_tag": pl.Utf8,          # memory format tags (abcd, acdb, aBcd8b, ...)
    "wei_tag": pl.Utf8,
    "dst_tag": pl.Utf8,
    "mds": pl.Utf8,              # raw memory-descriptor field
    "attrs": pl.Utf8,            # raw attribute field
    "aux": pl.Utf8,              # raw auxiliary field (alg:..., alpha/beta, flags, axis); benchdnn needs it
    "post_ops": pl.Utf8,         # benchdnn syntax, e.g. sum+relu
    "alg": pl.Utf8,              # convolution_direct, eltwise_relu, pooling_max, ...
    "problem": pl.Utf8,          # raw problem descriptor
    **{name: pl.Int64 for name in CONV_FIELDS},
    "m": pl.Int64,               # matmul / ip GEMM view
    "n": pl.Int64,
    "k": pl.Int64,
    "batch": pl.Int64,           # product of matmul batch dims (1 when none)
    "dims": pl.Utf8,             # dims of the main tensor, e.g. 16x64x56x56
    "time_ms": pl.Float64,       # execution (or creation) time printed by oneDNN
    "timestamp_ms": pl.Float64,  # ONEDNN_VERBOSE_TIMESTAMP value when present
    "flops": pl.Float64,         # benchdnn's convention (padding excluded for conv)
    "flops_dense": pl.Float64,   # 2*MACs over the full kernel window (torch.utils.flop_counter's)
    "bytes": pl.Float64,         # compulsory bytes moved: every tensor read or written once
}

PRIMITIVE_COLUMNS: tuple[str, ...] = tuple(PRIMITIVE_SCHEMA)

# Columns capture adds when it attributes primitives to the framework.
CAPTURE_SCHEMA: dict[str, pl.DataType] = {
    "op": pl.Utf8,      # framework op (aten::...) the primitive ran inside
    "module": pl.Utf8,  # dotted module path (layer1.0.conv1) or a pseudo-module (loss, optimizer)
    "phase": pl.Utf8,   # forward | backward | loss | optimizer | data | other
    "step": pl.Int64,   # training step index (0 = first measured step)
}
CAPTURE_COLUMNS: tuple[str, ...] = tuple(CAPTURE_SCHEMA)

DRIVERS: tuple[str, ...] = (
    "conv", "deconv", "ip", "matmul", "eltwise", "bnorm", "lnorm", "gnorm", "pool",
    "reorder", "sum", "concat", "binary", "softmax", "rnn", "lrn", "shuffle",
    "resampling", "reduction", "prelu", "zeropad",
)

DIRECTIONS: tuple[str, ...] = ("FWD_D", "FWD_B", "FWD_I", "BWD_D", "BWD_W", "BWD_WB", "BWD_DW")


def empty_primitives() -> pl.DataFrame:
    """An empty primitive table with the full schema."""
    return pl.DataFrame(schema=PRIMITIVE_SCHEMA)

"""The words every job shares: the phases of a training step, framework op families, native convolution kernels and
PyTorch's convolution calls, oneDNN's compute primitive kinds, memory
layout tags, dtype names and how each library spells them.

One place, so the analysis, the projection's replay and step model, the roofline, the
machine profile and optimize's family split draw the same lines (a fix here reaches all
of them). Plain Python, like ``verbose/dialects.py``: no torch, no polars, importable
anywhere.

Op names are ATen's without the ``aten::`` namespace (``add_``, ``addmm``); the profiler
records them as ``aten::add_``.
"""

from __future__ import annotations

from collections.abc import Iterable

PHASES: tuple[str, ...] = ("data", "forward", "loss", "backward", "optimizer", "other")
"""The phases of a training step, in the order of the ``steps`` table's ``*_ms`` columns."""

# -- framework op families ----------------------------------------------------------------
_ELEMENTWISE_BASES = (
    "add", "sub", "rsub", "mul", "div", "neg", "abs", "exp", "exp2", "expm1", "log", "log1p", "log2", "pow",
    "sqrt", "rsqrt", "reciprocal", "sigmoid", "tanh", "relu", "clamp", "clamp_min", "clamp_max", "where",
    "addcmul", "addcdiv", "lerp", "maximum", "minimum", "sign", "square", "erf", "floor", "ceil", "round",
    "gelu", "silu", "hardtanh", "leaky_relu", "threshold", "fill", "masked_fill",
    "threshold_backward", "sigmoid_backward", "tanh_backward", "gelu_backward", "silu_backward",
    "hardtanh_backward", "leaky_relu_backward",
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not",
    "binary_cross_entropy_with_logits",
)
ELEMENTWISE_OPS: frozenset[str] = frozenset(f"{name}{suffix}" for name in _ELEMENTWISE_BASES for suffix in ("", "_"))
"""Ops that compute each output element from the matching input elements (in-place
variants included): back to back, each one is a full pass over memory."""

COPY_OPS: frozenset[str] = frozenset({"copy_", "clone"})
"""Ops that copy a tensor's memory as it is."""
FILL_OPS: frozenset[str] = frozenset({"zero_"})
"""Ops that clear memory."""
COPY_FILL_OPS: frozenset[str] = COPY_OPS | FILL_OPS
"""Ops that copy or clear memory without arithmetic: the replay times them as elementwise
passes; the analysis does not count them as elementwise compute."""
LAYOUT_OPS: frozenset[str] = frozenset({
    "contiguous", "to", "_to_copy", "to_dense", "_to_dense", "to_mkldnn", "mkldnn_reorder_conv2d_weight",
    "cat", "_cat", "stack", "constant_pad_nd"})
"""Ops that move data into another layout, dtype or buffer (casts, reorders, concatenation,
padding): optimize's family split counts them with the copies as layout traffic."""

GEMM_OPS: frozenset[str] = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm"})
_TRAINING_BATCH_NORM_OPS = frozenset({"native_batch_norm", "native_batch_norm_backward"})
BATCH_NORM_OPS: frozenset[str] = _TRAINING_BATCH_NORM_OPS | {
    "_native_batch_norm_legit", "_native_batch_norm_legit_no_training"}
"""ATen's batch-norm kernels (the advice's batch-norm share); the replay models the training
pair of them (``NORM_OPS``)."""
NORM_OPS: frozenset[str] = _TRAINING_BATCH_NORM_OPS | {
    "native_layer_norm", "native_layer_norm_backward", "native_group_norm", "native_group_norm_backward"}
POOL_OPS: frozenset[str] = frozenset({
    "max_pool2d_with_indices", "max_pool2d_with_indices_backward", "avg_pool2d", "avg_pool2d_backward",
    "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward"})
REDUCE_OPS: frozenset[str] = frozenset({"sum", "mean"})
SOFTMAX_OPS: frozenset[str] = frozenset({"_softmax", "_log_softmax", "_softmax_backward_data",
                                         "_log_softmax_backward_data"})
LOSS_OPS: frozenset[str] = frozenset({
    "nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward", "nll_loss2d_backward",
    "binary_cross_entropy_with_logits", "mse_loss", "mse_loss_backward", "smooth_l1_loss",
    "smooth_l1_loss_backward"})

# Later families win: binary_cross_entropy_with_logits is elementwise math, filed as a loss.
OP_FAMILIES: dict[str, str] = {
    **dict.fromkeys(ELEMENTWISE_OPS | COPY_FILL_OPS, "elementwise"),
    **dict.fromkeys(GEMM_OPS, "gemm"),
    **dict.fromkeys(NORM_OPS, "norm"),
    **dict.fromkeys(POOL_OPS, "pool"),
    **dict.fromkeys(REDUCE_OPS, "reduce"),
    **dict.fromkeys(SOFTMAX_OPS, "softmax"),
    **dict.fromkeys(LOSS_OPS, "loss"),
}
"""The family of every framework op the projection replays (its FLOP/byte model is
``hardware/roofline.py``'s)."""


def op_family(op: str) -> str | None:
    """The family of a profiler op name (``aten::addmm`` -> ``gemm``); None for an op no
    family holds (it is not replayed)."""
    if not op.startswith("aten::"):
        return None
    return OP_FAMILIES.get(op.split("::", 1)[1])


def aten_names(names: Iterable[str]) -> list[str]:
    """The profiler's spelling of ATen op names: ``add_`` -> ``aten::add_`` (sorted)."""
    return sorted(f"aten::{name}" for name in names)


# -- native convolution kernels ------------------------------------------------------------
NATIVE_CONV_MARKERS: tuple[str, ...] = ("slow_conv", "thnn_conv", "nnpack_spatial_convolution")
"""Substrings of the ATen convolution kernels that run instead of oneDNN
(``_slow_conv2d_forward``, ``thnn_conv2d``, ``slow_conv_dilated2d``, ``_nnpack_spatial_convolution``)."""
NATIVE_CONV_PATTERN = "|".join(NATIVE_CONV_MARKERS)
"""The markers as one regular expression (``polars`` ``str.contains``)."""
GEMM_KERNEL_PATTERN = rf"^aten::(({'|'.join(sorted(GEMM_OPS))})$|\w*({NATIVE_CONV_PATTERN}))"
"""Native GEMM and convolution kernels by profiler op name; composites (``linear``,
``matmul``, ``convolution``) and oneDNN wrappers (``mkldnn_convolution``) are left out:
their self time is dispatch."""


def is_native_conv(op: str | None) -> bool:
    """An ATen convolution kernel that runs instead of oneDNN (``aten::_slow_conv2d_forward``...)."""
    return op is not None and any(marker in op for marker in NATIVE_CONV_MARKERS)


CONV_FORWARD_OP = "aten::convolution"
CONV_BACKWARD_OP = "aten::convolution_backward"
CONV_ROOTS: tuple[str, ...] = (CONV_FORWARD_OP, CONV_BACKWARD_OP)
"""PyTorch's convolution calls as the profiler records them, forward and backward: the
roots under which a convolution runs everything it runs (the step model replays them whole)."""

# -- oneDNN primitive kinds (benchdnn drivers) ------------------------------------------------
CONV_DRIVERS: frozenset[str] = frozenset({"conv", "deconv"})
"""The convolution drivers (a deconvolution is a transposed convolution)."""
COMPUTE_DRIVERS: frozenset[str] = CONV_DRIVERS | {"ip", "matmul"}
"""The drivers that compute GEMMs (convolutions, inner products, matmuls): they carry
weights, count model FLOPs and run faster in a native reduced precision."""

# -- layers ------------------------------------------------------------------------------
PSEUDO_MODULES: tuple[str, ...] = ("data", "loss", "optimizer")
"""Phases that are no layer's: capture files their time in the ``layers`` table under a
module of the same name."""

# -- memory layout tags (oneDNN format tags) ------------------------------------------------
PLAIN_ACTIVATION_TAGS: frozenset[str] = frozenset({"abc", "abcd", "abcde"})
CHANNELS_LAST_TAGS: frozenset[str] = frozenset({"acb", "acdb", "acdeb"})
"""NWC, NHWC and NDHWC: what ``torch.channels_last`` tensors look like to oneDNN."""

# -- dtypes ----------------------------------------------------------------------------------
DTYPE_NAMES: tuple[str, ...] = ("fp32", "bf16", "fp16")
"""ProfileDNN's names for the compute dtypes (the CLI's ``--dtype``, machine peaks, MFU)."""
TORCH_DTYPE: dict[str, str] = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
"""Name -> the ``torch`` attribute (``getattr(torch, TORCH_DTYPE["bf16"])``)."""
ONEDNN_DTYPE: dict[str, str] = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}
"""Name -> oneDNN's spelling (a primitive's ``src_dt``, a replay case's ``dtype``)."""
PROFILER_DTYPE: dict[str, str] = {"fp32": "float", "bf16": "c10::BFloat16", "fp16": "c10::Half"}
"""Name -> ``torch.profiler``'s spelling in an op's recorded input types."""
DTYPE_ALIASES: dict[str, str] = {
    **{name: name for name in DTYPE_NAMES},
    **{TORCH_DTYPE[name]: name for name in DTYPE_NAMES},
    **{ONEDNN_DTYPE[name]: name for name in DTYPE_NAMES},
    "float": "fp32", "half": "fp16",
}
"""Every accepted spelling (lower case) -> its name."""

PROFILER_TENSOR_TYPES: dict[str, str] = {
    "float": "float32", "double": "float64", "c10::BFloat16": "bfloat16", "c10::Half": "float16",
    "long int": "int64", "int": "int32", "short int": "int16", "signed char": "int8",
    "unsigned char": "uint8", "bool": "bool",
}
"""Every tensor type ``torch.profiler`` records -> the ``torch`` attribute."""
PROFILER_TYPE_BYTES: dict[str, int] = {
    "float": 4, "double": 8, "c10::BFloat16": 2, "c10::Half": 2, "long int": 8, "int": 4,
    "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1,
}
"""Bytes per element of each recorded tensor type."""

_FROM_ONEDNN = {spelling: name for name, spelling in ONEDNN_DTYPE.items()}
_FROM_PROFILER = {spelling: name for name, spelling in PROFILER_DTYPE.items()}


def dtype_name(spelling: str) -> str | None:
    """``f32``/``float32``/``FP32`` -> ``fp32`` (likewise bf16, fp16); None for another spelling."""
    return DTYPE_ALIASES.get(str(spelling).strip().lower())


def cfg_dtype(src_dt: str | None) -> str:
    """oneDNN data type (``f32``, ``bf16``) -> dtype name; fp32 when unset or another type."""
    return _FROM_ONEDNN.get(src_dt or "f32", "fp32")


def op_dtype(dtypes: Iterable[str]) -> str:
    """The dtype name of an op from its recorded input types: its first tensor's (fp32 when
    it has no floating-point half type or no tensor at all)."""
    first = next((d for d in dtypes if d in PROFILER_TYPE_BYTES), "float")
    return _FROM_PROFILER.get(first, "fp32")


__all__ = [
    "BATCH_NORM_OPS", "CHANNELS_LAST_TAGS", "COMPUTE_DRIVERS", "CONV_BACKWARD_OP", "CONV_DRIVERS", "CONV_FORWARD_OP",
    "CONV_ROOTS", "COPY_FILL_OPS", "COPY_OPS", "DTYPE_ALIASES", "DTYPE_NAMES", "ELEMENTWISE_OPS", "FILL_OPS",
    "GEMM_KERNEL_PATTERN", "GEMM_OPS", "LAYOUT_OPS", "LOSS_OPS", "NATIVE_CONV_MARKERS", "NATIVE_CONV_PATTERN",
    "NORM_OPS", "ONEDNN_DTYPE", "OP_FAMILIES", "PHASES", "PLAIN_ACTIVATION_TAGS", "POOL_OPS", "PROFILER_DTYPE",
    "PROFILER_TENSOR_TYPES", "PROFILER_TYPE_BYTES", "PSEUDO_MODULES", "REDUCE_OPS", "SOFTMAX_OPS", "TORCH_DTYPE",
    "aten_names", "cfg_dtype", "dtype_name", "is_native_conv", "op_dtype", "op_family",
]

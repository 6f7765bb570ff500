"""Polars expressions that classify profiler events and memory formats.

Kept in one place so every analyzer (coverage, fragmentation, advice, compare) draws
the same lines: which profiler events are kernels, which are elementwise, which
reorders move activations rather than weights. The op and tag names they test come from
``profilednn.vocabulary``, shared with the projection and optimize.
"""

from __future__ import annotations

import polars as pl

from ..vocabulary import ELEMENTWISE_OPS, aten_names

# Profiler events whose self time is framework bookkeeping, not a kernel: autograd
# engine wrappers (`autograd::engine::evaluate_function: ...`), `torch::autograd::...`,
# record_function regions (`Optimizer.step#SGD.step`, `ProfilerStep#3`), `[memory]`.
NON_KERNEL_NAMESPACES: frozenset[str] = frozenset({"autograd", "torch", "profiler", "profilednn"})

# Native ops that only reinterpret or allocate memory: they do no arithmetic.
BOOKKEEPING_OPS: frozenset[str] = frozenset(
    f"aten::{name}"
    for name in (
        "empty", "empty_like", "empty_strided", "view", "reshape", "as_strided",
        "as_strided_", "resize_", "expand", "t", "transpose", "permute", "detach",
        "resolve_conj", "resolve_neg", "to", "_to_copy", "flatten", "unsqueeze", "squeeze",
        "select", "slice", "alias", "contiguous", "size", "stride", "_unsafe_view",
        "lift_fresh", "zeros", "ones", "ones_like", "zeros_like", "new_empty",
    )
)

# Composite ops that only dispatch to the op doing the work (aten::conv2d ->
# aten::convolution -> aten::_convolution -> aten::mkldnn_convolution): not kernels.
COMPOSITE_OPS: frozenset[str] = frozenset(
    f"aten::{name}"
    for name in (
        "conv1d", "conv2d", "conv3d", "convolution", "_convolution", "conv_transpose1d",
        "conv_transpose2d", "conv_transpose3d", "batch_norm", "_batch_norm_impl_index",
        "instance_norm", "group_norm", "layer_norm", "linear", "matmul", "relu", "relu_",
        "dropout", "feature_dropout", "cross_entropy_loss", "nll_loss_nd", "nll_loss",
        "log_softmax", "softmax", "adaptive_avg_pool2d", "max_pool2d", "mean", "flatten",
        "scaled_dot_product_attention", "embedding",
    )
)

_ELEMENTWISE_EVENTS = aten_names(ELEMENTWISE_OPS)


def op_namespace(expr: pl.Expr) -> pl.Expr:
    """The text before the first ``::`` (null when the name has none)."""
    return pl.when(expr.str.contains("::", literal=True)).then(
        expr.str.split("::").list.first()
    ).otherwise(None)


def is_native_op(expr: pl.Expr) -> pl.Expr:
    """True for kernel ops (``aten::``, ``torchvision::``, ...), false for wrappers.

    Wrappers are autograd engine nodes, record_function regions and markers: their
    self time is framework overhead (Python, dispatch, autograd bookkeeping).
    """
    ns = op_namespace(expr)
    return ns.is_not_null() & ~ns.is_in(list(NON_KERNEL_NAMESPACES))


def is_kernel_op(expr: pl.Expr) -> pl.Expr:
    """Native ops that do the work themselves: not wrappers, composites or bookkeeping."""
    return (
        is_native_op(expr).fill_null(False)
        & ~expr.is_in(list(COMPOSITE_OPS))
        & ~expr.is_in(list(BOOKKEEPING_OPS))
    )


def is_elementwise_op(expr: pl.Expr) -> pl.Expr:
    """Elementwise ATen ops (``aten::add_``, ``aten::gelu_backward``: ``vocabulary.ELEMENTWISE_OPS``)."""
    return expr.is_in(_ELEMENTWISE_EVENTS)


def is_weight_tag(expr: pl.Expr) -> pl.Expr:
    """Whether a memory format tag is a weight layout (``Acdb8a``, ``ABcd8b8a``, ``aBCde8c8b``).

    oneDNN names blocked dimensions with capitals. Activations block only the channel
    (``aBcd8b``); weights block the output channel (a capital first letter) or two
    dimensions at once. Plain tags (``abcd``) cannot be told apart and count as
    activations.
    """
    return expr.str.contains(r"^[A-Z]") | (expr.str.count_matches(r"[A-Z]") >= 2)

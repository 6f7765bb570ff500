"""Advice rule ``conv_weight_grad``: 1x1 convolutions' weight gradients run slower than a
GEMM of the same size.

A 1x1 convolution is a matrix product, and so is its weight gradient (``dW = dY^T X``),
with the same FLOPs as its forward. oneDNN computes the weight gradient as a
backward-by-weights convolution, which can run far below the rate of the same shape's
forward: on a 2-core Xeon with AMX, ResNet-50's 1x1 weight gradients in BF16 ran at
220-1,050 GFLOP/s against ~1,700 for the same shapes' forwards. The forward of each shape
in the same Run is therefore the measure of what a GEMM of that size reaches on this CPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from ..vocabulary import CHANNELS_LAST_TAGS
from .rulebook import Advice, denominator, rule, severity_for

if TYPE_CHECKING:
    from .view import RunView

CONV_WEIGHT_GRAD_MIN_PCT = 2.0  # the estimated saving >= 2% of the step (of oneDNN time for a log)
# one problem: a weight gradient and a forward with these fields (and source dtype) are one shape
SHAPE_KEY = ("mb", "ic", "oc", "ih", "iw", "oh", "ow", "sh", "sw", "src_dt")


def pointwise_convolutions(prims: pl.DataFrame) -> pl.DataFrame:
    """The oneDNN convolutions ``pointwise_gemms`` takes: 2-D, 1x1, one group, no
    padding, undilated (oneDNN counts dilation from 0), the same stride both ways."""
    def is_(column: str, value: int) -> pl.Expr:
        return pl.col(column).fill_null(value) == value

    return prims.filter(
        (pl.col("prim_kind") == "convolution") & (pl.col("kh") == 1) & (pl.col("kw") == 1) & is_("kd", 1)
        & is_("g", 1) & is_("ph", 0) & is_("pw", 0) & is_("pd", 0) & is_("dh", 0) & is_("dw", 0) & is_("dd", 0)
        & (pl.col("sh") == pl.col("sw"))
    )


def weight_grad_shapes(prims: pl.DataFrame, n_steps: int) -> pl.DataFrame:
    """Per 1x1 problem shape (``SHAPE_KEY``) that has both a backward-by-weights and a
    forward primitive, per step: the weight gradients' calls, ms and FLOPs, the forwards'
    ms and FLOPs, ``gemm_ms`` (the weight gradients' FLOPs at the forwards' rate) and
    ``gain_ms`` = max(0, bwd_ms - gemm_ms); largest gain first. Shapes without a forward
    (or without FLOPs to rate it) are left out: nothing here says what a GEMM reaches."""
    conv = pointwise_convolutions(prims).with_columns(
        pl.col("src_dt").fill_null(""), flops=pl.col("flops").fill_null(0.0))
    key = list(SHAPE_KEY)
    prop = pl.col("prop_kind").fill_null("")
    bwd = conv.filter(prop == "backward_weights").group_by(key).agg(
        shape_calls=pl.len(), bwd_ms=pl.col("time_ms").sum(), bwd_flops=pl.col("flops").sum(),
        tag=pl.col("src_tag").drop_nulls().mode().first(), impl=pl.col("impl").drop_nulls().mode().first())
    fwd = conv.filter(prop.str.starts_with("forward")).group_by(key).agg(
        fwd_ms=pl.col("time_ms").sum(), fwd_flops=pl.col("flops").sum())
    shapes = bwd.join(fwd, on=key, how="inner").filter(
        (pl.col("fwd_ms") > 0) & (pl.col("fwd_flops") > 0) & (pl.col("bwd_flops") > 0))
    per_step = [pl.col(c) / n_steps for c in ("shape_calls", "bwd_ms", "bwd_flops", "fwd_ms", "fwd_flops")]
    return (
        shapes.with_columns(per_step)
        .with_columns(gemm_ms=pl.col("bwd_flops") * pl.col("fwd_ms") / pl.col("fwd_flops"))
        .with_columns(gain_ms=(pl.col("bwd_ms") - pl.col("gemm_ms")).clip(lower_bound=0.0))
        .sort(["gain_ms", "bwd_ms"], descending=True)
    )


def _gflops(flops: float, ms: float) -> str:
    return f"{flops / ms / 1e6:,.0f}" if ms > 0 else "?"


def shape_label(row: dict) -> str:
    """A readable shape: ``512->2048 at 7x7, batch 16`` (``, stride 2`` where strided)."""
    stride = f", stride {row['sh']}" if row["sh"] != 1 else ""
    return f"{row['ic']}->{row['oc']} at {row['ih']}x{row['iw']}{stride}, batch {row['mb']}"


@rule("conv_weight_grad")
def conv_weight_grad(a: "RunView") -> Advice | None:
    """1x1 convolutions' weight gradients (oneDNN backward-by-weights) run below the rate
    of the same shapes' forward convolutions, a GEMM of the same FLOPs.

    Gain: per step, the sum over 1x1 shapes (one group, no padding, undilated) of
    max(0, t_bwd_w - flops_bwd_w / rate_fwd), rate_fwd being the same shape's forward
    FLOP/s in this Run: the weight gradient computed as one GEMM at what a GEMM of that
    size reaches here. Shapes without a forward of the same problem are left out. Fires
    at ``CONV_WEIGHT_GRAD_MIN_PCT`` (2%) of the step or more.
    """
    prims = a.primitives
    denom, of_what = denominator(a)
    if prims is None or prims.height == 0 or not denom:
        return None
    shapes = weight_grad_shapes(prims, a.n_steps)
    if shapes.height == 0:
        return None
    gain_ms = float(shapes["gain_ms"].sum())
    gain = gain_ms / denom * 100.0
    if gain < CONV_WEIGHT_GRAD_MIN_PCT:
        return None
    bwd_ms, bwd_flops = float(shapes["bwd_ms"].sum()), float(shapes["bwd_flops"].sum())
    fwd_ms, fwd_flops = float(shapes["fwd_ms"].sum()), float(shapes["fwd_flops"].sum())
    rates = (shapes["bwd_flops"] / shapes["bwd_ms"] / 1e6).drop_nans().drop_nulls()
    spread = f", {rates.min():,.0f}-{rates.max():,.0f} by shape" if shapes.height > 1 and rates.len() else ""
    worst = shapes.row(0, named=True)
    impl = f", {worst['impl']}" if worst["impl"] else ""
    tags = set(shapes["tag"].drop_nulls().to_list())
    not_nhwc = sorted(tags - CHANNELS_LAST_TAGS)
    layout = (f" This Run's activations reach oneDNN as {', '.join(not_nhwc)}, not channels_last: apply "
              "channels_last first (recipe channels_last)." if not_nhwc else "")
    which = "The worst" if shapes.height > 1 else "The shape"
    return Advice(
        rule="conv_weight_grad",
        severity=severity_for(gain),
        evidence=(
            f"1x1 convolutions' weight gradients (oneDNN backward-by-weights{impl}) take {bwd_ms:.2f} ms per step "
            f"({bwd_ms / denom * 100.0:.1f}% {of_what}, {float(shapes['shape_calls'].sum()):.0f} calls per step "
            f"over {shapes.height} shape(s)) at {_gflops(bwd_flops, bwd_ms)} GFLOP/s{spread}, where the same "
            f"shapes' forward convolutions, a GEMM of the same FLOPs, run at {_gflops(fwd_flops, fwd_ms)} GFLOP/s; "
            f"at that rate they would take {float(shapes['gemm_ms'].sum()):.2f} ms. {which}: "
            f"{shape_label(worst)}, {_gflops(worst['bwd_flops'], worst['bwd_ms'])} against "
            f"{_gflops(worst['fwd_flops'], worst['fwd_ms'])} GFLOP/s ({worst['bwd_ms']:.2f} ms per step)"
        ),
        estimated_gain_pct=gain,
        action=(
            "Compute the 1x1 convolutions as GEMMs over the channels_last activations as they lie in memory "
            "(dW = dY^T X; the forward X W^T and the input gradient dY W too), instead of oneDNN's convolution "
            "primitives: `model, _ = profilednn.kernels.pointwise_gemms(model)` (recipe pointwise_gemm; exact to "
            "the GEMMs' rounding). It needs channels_last (model.to(memory_format=torch.channels_last) and the "
            "inputs too): with NCHW activations the convolutions stay stock." + layout
        ),
    )


__all__ = ["CONV_WEIGHT_GRAD_MIN_PCT", "conv_weight_grad", "pointwise_convolutions", "shape_label",
           "weight_grad_shapes"]

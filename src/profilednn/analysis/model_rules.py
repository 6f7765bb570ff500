"""Advice rules on the model's own computation: its activation layout (channels_last), BF16
on a CPU without native BF16, the loss, frozen layers that still compute weight gradients,
and batch norm run as separate passes (FrozenBatchNorm's elementwise ops, training batch
norm and the ReLUs around it).

Each rule looks at one thing, documents its threshold and how it estimates the gain, and
returns an :class:`~profilednn.analysis.rulebook.Advice` (or ``None`` when it does not
apply); gains are estimates from the Run's own measurements times a stated factor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from ..vocabulary import BATCH_NORM_OPS, PLAIN_ACTIVATION_TAGS, aten_names
from ..recipe_catalogue import CHANNELS_LAST, FROZEN_WEIGHT_GRADS, FUSED_LOSS
from .rulebook import Advice, denominator, native_bf16, per_step, rule, severity_for, steps_mean
from .taxonomy import is_elementwise_op, is_native_op, is_weight_tag

if TYPE_CHECKING:
    from .view import RunView


# ------------------------------------------------------------------------- layouts
REORDER_SHARE_MIN_PCT = 5.0  # reorders >= 5% of the step (10% of oneDNN time for a log)
REORDER_SHARE_OF_ONEDNN_MIN_PCT = 10.0
NCHW_REORDER_MIN_PCT = 1.0  # reorders of plain NCHW activations >= 1% of the step


@rule(CHANNELS_LAST)
def channels_last(a: "RunView") -> Advice | None:
    """Reorders take a large share, and activations are converted from/to plain NCHW.

    With NCHW tensors oneDNN reorders activations into its blocked layout before a
    convolution and back after it; with channels_last it reads and writes NHWC directly.
    Gain: the time of activation reorders with a plain NCHW side (weight reorders stay,
    oneDNN still blocks weights).
    """
    prims = a.primitives
    denom, of_what = denominator(a)
    if prims is None or prims.height == 0 or not denom:
        return None
    reorder = prims.filter(pl.col("driver") == "reorder")
    reorder_ms = per_step(reorder, "time_ms", a)
    share = reorder_ms / denom * 100.0
    threshold = REORDER_SHARE_MIN_PCT if a.step_ms else REORDER_SHARE_OF_ONEDNN_MIN_PCT
    src, dst = pl.col("src_tag").fill_null(""), pl.col("dst_tag").fill_null("")
    plain = list(PLAIN_ACTIVATION_TAGS)
    nchw = reorder.filter(~(is_weight_tag(src) | is_weight_tag(dst)) & (src.is_in(plain) | dst.is_in(plain)))
    nchw_ms = per_step(nchw, "time_ms", a)
    gain = nchw_ms / denom * 100.0
    if share < threshold or gain < NCHW_REORDER_MIN_PCT:
        return None
    tags = nchw.group_by(["src_tag", "dst_tag"]).agg(ms=pl.col("time_ms").sum()).sort("ms", descending=True)
    example = f"{tags['src_tag'][0]}\u2192{tags['dst_tag'][0]}"
    return Advice(
        rule=CHANNELS_LAST,
        severity=severity_for(gain),
        evidence=(
            f"reorders take {share:.1f}% {of_what} ({reorder_ms:.3f} ms and "
            f"{reorder.height / a.n_steps:.0f} calls per step); {gain:.1f}% {of_what} converts "
            f"NCHW activations to and from oneDNN's blocked layout ({nchw.height / a.n_steps:.0f} "
            f"calls per step, e.g. {example})"
        ),
        estimated_gain_pct=gain,
        action=(
            "Use channels_last end to end: model = model.to(memory_format=torch.channels_last) "
            "and x = x.to(memory_format=torch.channels_last) for every input batch. oneDNN then "
            "reads and writes NHWC activations directly and the activation reorders around each "
            "convolution go away (weight reorders remain)."
        ),
    )


# ------------------------------------------------------------------------- BF16
EMULATED_BF16_SLOWDOWN = 16.0  # ResNet-50 training, BF16 vs fp32, AVX2 EPYC without BF16
BF16_SHARE_MIN_PCT = 1.0
@rule("bf16_without_native_bf16")
def bf16_without_native_bf16(a: "RunView") -> Advice | None:
    """BF16 kernels run on a CPU without native BF16 (no avx512_bf16, no AMX).

    Gain: the BF16 share s of the step would take s / 16 in fp32 (the emulated-BF16
    slowdown measured for ResNet-50 training on such a CPU), so s * (1 - 1/16).
    """
    if native_bf16(a.fingerprint) is not False:
        return None
    denom, of_what = denominator(a)
    if not denom:
        return None
    bf16_ms = 0.0
    prims = a.primitives
    if prims is not None and prims.height:
        is_bf16 = pl.any_horizontal(
            [pl.col(c).fill_null("").str.contains("bf16") for c in ("cfg", "src_dt", "wei_dt", "dst_dt")]
        )
        bf16_ms += per_step(prims.filter(is_bf16), "time_ms", a)
    if a.ops is not None and a.ops.height:
        ops = a.ops.filter(
            pl.col("dtypes").fill_null("").str.contains("BFloat16") & is_native_op(pl.col("op")).fill_null(False)
        )
        native = ops.with_columns(
            n=(pl.col("self_time_ms") - pl.col("onednn_ms").fill_null(0.0)).clip(lower_bound=0.0)
        )
        bf16_ms += per_step(native, "n", a)
    share = min(bf16_ms / denom * 100.0, 100.0)
    if share < BF16_SHARE_MIN_PCT:
        return None
    gain = share * (1.0 - 1.0 / EMULATED_BF16_SLOWDOWN)
    return Advice(
        rule="bf16_without_native_bf16",
        severity="high",
        evidence=(
            f"BF16 kernels take {share:.1f}% {of_what} ({bf16_ms:.2f} ms per step) on a CPU "
            f"without native BF16 ({a.fingerprint.get('cpu_model') or 'no avx512_bf16/amx_bf16'})"
        ),
        estimated_gain_pct=gain,
        action=(
            "Train in float32 on this CPU: without avx512_bf16 or AMX, oneDNN emulates BF16 and "
            f"ResNet-50 training ran {EMULATED_BF16_SLOWDOWN:.0f}x slower than fp32 on such a CPU. "
            "Drop torch.autocast(device_type='cpu', dtype=torch.bfloat16) / .bfloat16(); use BF16 "
            "only where the ISA has it, and keep the loss in fp32 even then."
        ),
    )


# ------------------------------------------------------------------------- loss
LOSS_SHARE_MIN_PCT = 10.0
LOSS_FUSION_SAVING = 0.5  # seed 000: the custom focal-loss kernel made the loss 2x faster


def _top_ops(ops: pl.DataFrame | None, where: pl.Expr, n: int = 3) -> str:
    if ops is None:
        return ""
    top = (
        ops.filter(where & is_native_op(pl.col("op")).fill_null(False))
        .group_by("op")
        .agg(ms=pl.col("self_time_ms").sum())
        .sort(["ms", "op"], descending=[True, False])
        .head(n)
    )
    return ", ".join(top["op"].to_list())


@rule(FUSED_LOSS)
def fused_loss(a: "RunView") -> Advice | None:
    """The loss (forward and its backward) takes a large share of the step.

    Gain: half the loss time (seed 000's fused focal loss, forward and backward, was
    2x faster than the composed PyTorch ops).
    """
    fwd = steps_mean(a, "loss_ms")
    if fwd is None or not a.step_ms:
        return None
    bwd, how = a.loss_backward()
    share = (fwd + bwd) / a.step_ms * 100.0
    if share < LOSS_SHARE_MIN_PCT:
        return None
    gain = share * LOSS_FUSION_SAVING
    top = _top_ops(a.ops, (pl.col("phase") == "loss") | (pl.col("module") == "loss"))
    return Advice(
        rule=FUSED_LOSS,
        severity=severity_for(gain),
        evidence=(
            f"the loss takes {share:.1f}% of the step ({fwd:.2f} ms forward + {bwd:.2f} ms "
            f"backward per step{f', from {how}' if how else ''})" + (f"; its largest ops: {top}" if top else "")
        ),
        estimated_gain_pct=gain,
        action=(
            "Fuse the loss into one kernel with an explicit backward. For torchvision's "
            "sigmoid_focal_loss use profilednn.kernels.sigmoid_focal_loss (recipe fused_loss: one "
            "vectorised pass writes the loss and its gradient, faster than torch.compile of it); "
            "otherwise a torch.autograd.Function whose forward and backward work in place on few "
            "intermediates (or torch.compile the loss function). Keep it in fp32."
        ),
    )


# ------------------------------------------------------------------------- frozen layers
FROZEN_WEIGHT_GRAD_MIN_PCT = 1.0
WEIGHT_GRAD_SHARE_OF_BACKWARD = 0.5  # without oneDNN BWD_W rows: half a layer's backward


@rule(FROZEN_WEIGHT_GRADS)
def frozen_weight_grads(a: "RunView") -> Advice | None:
    """Layers that are frozen still compute weight gradients.

    Frozen means: the module owns parameters but none is trainable and yet weight
    gradients (oneDNN BWD_W) run for it, or (when capture records ``optimized_params``)
    its parameters require grad but no optimizer updates them. Gain: the time of those
    weight gradients (BWD_W primitives; else half the layer's backward time).
    """
    layers, prims = a.layers, a.primitives
    denom, of_what = denominator(a)
    if layers is None or not denom:
        return None
    per_module = layers.group_by("module").agg(
        params=pl.col("params").first(),
        trainable=pl.col("trainable_params").first(),
        optimized=pl.col("optimized_params").first() if "optimized_params" in layers.columns else pl.lit(None),
        backward_ms=pl.col("time_ms").filter(pl.col("phase") == "backward").sum(),
    )
    frozen_no_grad = per_module.filter((pl.col("params") > 0) & (pl.col("trainable") == 0))["module"].to_list()
    not_optimized = per_module.filter(
        (pl.col("trainable") > 0) & (pl.col("optimized") == 0)
    )
    bwd_w = pl.DataFrame()
    if prims is not None and prims.height:
        bwd_w = prims.filter(pl.col("direction").is_in(["BWD_W", "BWD_WB"]))
    wasted_ms, modules = 0.0, []
    for module in frozen_no_grad:
        ms = per_step(bwd_w.filter(pl.col("module") == module), "time_ms", a) if bwd_w.height else 0.0
        if ms > 0:
            wasted_ms += ms
            modules.append(module)
    for module, backward_ms in zip(not_optimized["module"].to_list(), not_optimized["backward_ms"].to_list()):
        ms = per_step(bwd_w.filter(pl.col("module") == module), "time_ms", a) if bwd_w.height else 0.0
        if ms == 0.0:
            ms = float(backward_ms or 0.0) / a.n_steps * WEIGHT_GRAD_SHARE_OF_BACKWARD
        if ms > 0:
            wasted_ms += ms
            modules.append(module)
    gain = wasted_ms / denom * 100.0
    if not modules or gain < FROZEN_WEIGHT_GRAD_MIN_PCT:
        return None
    shown = ", ".join(modules[:5]) + (f" and {len(modules) - 5} more" if len(modules) > 5 else "")
    return Advice(
        rule=FROZEN_WEIGHT_GRADS,
        severity=severity_for(gain),
        evidence=(
            f"{len(modules)} frozen layer(s) compute weight gradients nobody uses: {shown}; "
            f"{wasted_ms:.2f} ms per step ({gain:.1f}% {of_what})"
        ),
        estimated_gain_pct=gain,
        action=(
            "Freeze them for autograd too: for p in layer.parameters(): p.requires_grad_(False) "
            "(torchvision detection models: trainable_backbone_layers). Autograd then skips their "
            "weight gradients, and the data gradients of the first frozen layers as well."
        ),
    )


# ------------------------------------------------------------------------- FrozenBatchNorm
FROZEN_BN_MIN_PCT = 1.0
FROZEN_BN_MIN_ELEMENTWISE_PER_CALL = 2
FROZEN_BN_FUSION_SAVING = 0.5  # x*scale + shift in one pass instead of two over the activation


@rule("frozen_batchnorm_unfused")
def frozen_batchnorm_unfused(a: "RunView") -> Advice | None:
    """FrozenBatchNorm runs as separate elementwise kernels (mul, add, per-channel ops).

    Gain: half their time: one fused per-channel affine makes one pass over the
    activation where mul then add make two, and the per-channel ops go away.
    """
    ops = a.ops
    if ops is None or not a.step_ms:
        return None
    fbn = ops.filter(pl.col("module_type").fill_null("").str.contains("FrozenBatchNorm"))
    ew = fbn.filter(is_elementwise_op(pl.col("op")))
    if ew.height == 0:
        return None
    fwd_calls = float(ew.filter(pl.col("phase") == "forward")["calls"].sum() or 0)
    module_calls = 0.0
    if a.layers is not None:
        module_calls = float(
            a.layers.filter(
                pl.col("module_type").fill_null("").str.contains("FrozenBatchNorm") & (pl.col("phase") == "forward")
            )["calls"].sum()
            or 0
        )
    if module_calls == 0:
        module_calls = float(fbn.filter(pl.col("phase") == "forward")["module"].n_unique() * a.n_steps)
    per_call = fwd_calls / module_calls if module_calls else 0.0
    ms = per_step(ew, "self_time_ms", a)
    share = ms / a.step_ms * 100.0
    if per_call < FROZEN_BN_MIN_ELEMENTWISE_PER_CALL or share < FROZEN_BN_MIN_PCT:
        return None
    kinds = ", ".join(sorted(ew.filter(pl.col("phase") == "forward")["op"].unique().to_list()))
    gain = share * FROZEN_BN_FUSION_SAVING
    return Advice(
        rule="frozen_batchnorm_unfused",
        severity=severity_for(gain),
        evidence=(
            f"FrozenBatchNorm2d runs as {per_call:.1f} elementwise kernels per call ({kinds}), "
            f"{ms:.2f} ms per step ({share:.1f}% of the step) over "
            f"{module_calls / a.n_steps:.0f} calls per step"
        ),
        estimated_gain_pct=gain,
        action=(
            "Replace torchvision's FrozenBatchNorm2d with a fused per-channel affine: compute "
            "scale = w * (rv + eps).rsqrt() and shift = b - rm * scale once (they are frozen) and "
            "apply torch.addcmul(shift, x, scale) in one kernel, or fold scale and shift into the "
            "preceding convolution's weight and bias."
        ),
    )


# ------------------------------------------------------------------------- batch norm
BATCHNORM_SHARE_MIN_PCT = 10.0
# Fused batch norm + ReLU forward and backward vs stock eager at ResNet-50's BF16
# channels_last shapes: about half the time (benchmarks/bench_optimize.py --kernel).
BATCHNORM_FUSION_SAVING = 0.5
BATCHNORM_OPS = tuple(aten_names(BATCH_NORM_OPS))
RELU_OPS = ("aten::relu_", "aten::relu", "aten::clamp_min_", "aten::clamp_min", "aten::threshold_backward")


@rule("batchnorm_passes")
def batchnorm_passes(a: "RunView") -> Advice | None:
    """Training batch norm and the ReLUs around it take a large share of the step, each a
    separate pass over an activation.

    Gain: half of the batch norm and ReLU time (the fused kernel, forward + backward, at
    ResNet-50's shapes; ``benchmarks/bench_optimize.py --kernel``).
    """
    ops = a.ops
    if ops is None or ops.height == 0 or not a.step_ms:
        return None
    bn = ops.filter(pl.col("op").is_in(list(BATCHNORM_OPS)))
    if bn.height == 0:
        return None
    relu = ops.filter(pl.col("op").is_in(list(RELU_OPS)))
    bn_ms, relu_ms = per_step(bn, "self_time_ms", a), per_step(relu, "self_time_ms", a)
    share = (bn_ms + relu_ms) / a.step_ms * 100.0
    if share < BATCHNORM_SHARE_MIN_PCT:
        return None
    gain = share * BATCHNORM_FUSION_SAVING
    calls = float(bn.filter(pl.col("op") == "aten::native_batch_norm")["calls"].sum() or 0) / a.n_steps
    return Advice(
        rule="batchnorm_passes",
        severity=severity_for(gain),
        evidence=(f"batch norm forward + backward {bn_ms:.2f} ms and ReLU {relu_ms:.2f} ms per step "
                  f"({share:.1f}% of the step, {calls:.0f} batch norms per step), each a separate pass "
                  "over an activation"),
        estimated_gain_pct=gain,
        action=("Run batch norm with the ReLU (or residual add + ReLU) after it as one fused kernel: "
                "model, _ = profilednn.kernels.fuse_batch_norm(model) (recipe fused_batchnorm); exact to "
                "fp32 rounding, training statistics kept."),
    )


__all__ = [
    "BATCHNORM_FUSION_SAVING", "BATCHNORM_OPS", "BATCHNORM_SHARE_MIN_PCT", "BF16_SHARE_MIN_PCT",
    "EMULATED_BF16_SLOWDOWN", "FROZEN_BN_FUSION_SAVING", "FROZEN_BN_MIN_ELEMENTWISE_PER_CALL", "FROZEN_BN_MIN_PCT",
    "FROZEN_WEIGHT_GRAD_MIN_PCT", "LOSS_FUSION_SAVING", "LOSS_SHARE_MIN_PCT", "NCHW_REORDER_MIN_PCT", "RELU_OPS",
    "REORDER_SHARE_MIN_PCT", "REORDER_SHARE_OF_ONEDNN_MIN_PCT", "WEIGHT_GRAD_SHARE_OF_BACKWARD", "batchnorm_passes",
    "bf16_without_native_bf16", "channels_last", "frozen_batchnorm_unfused", "frozen_weight_grads", "fused_loss",
]

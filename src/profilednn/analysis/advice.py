"""Advice: rules that turn a Run's findings into ranked recommendations.

Each rule looks at one thing, documents its threshold and how it estimates the gain,
and returns an :class:`Advice` (or ``None`` when it does not apply). Gains are
percentages of the mean step time (of oneDNN time for a bare log), estimated from the
Run's own measurements times a stated factor; they are estimates, not promises.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

import polars as pl

from ..recipe_catalogue import ALLOCATOR, CHANNELS_LAST, FROZEN_WEIGHT_GRADS, FUSED_LOSS, FUSED_OPTIMIZER
from ..vocabulary import PLAIN_ACTIVATION_TAGS
from .rulebook import (
    NATIVE_BF16_FLAGS,
    Advice,
    Rule,
    cached_machine_here,
    denominator,
    native_bf16,
    per_step,
    rule,
    severity_for,
)
from .taxonomy import is_elementwise_op, is_native_op, is_weight_tag

if TYPE_CHECKING:
    from .facade import Analysis


def _steps_mean(a: "Analysis", column: str) -> float | None:
    if a.steps is None or column not in a.steps.columns or a.steps[column].drop_nulls().len() == 0:
        return None
    return float(a.steps[column].mean())


def _compute_share(a: "Analysis", denom: float) -> float | None:
    """Percentage of the step spent in kernels (oneDNN + native ATen); None if unknown."""
    if a.steps is None or a.ops is None:  # a log, or a light capture: native time unknown
        return None
    cov = a.coverage()
    kernel = cov.filter(pl.col("component").is_in(["onednn", "aten"]))["ms_per_step"].sum()
    return min(float(kernel or 0.0) / denom * 100.0, 100.0)


# ------------------------------------------------------------------------- layouts
REORDER_SHARE_MIN_PCT = 5.0  # reorders >= 5% of the step (10% of oneDNN time for a log)
REORDER_SHARE_OF_ONEDNN_MIN_PCT = 10.0
NCHW_REORDER_MIN_PCT = 1.0  # reorders of plain NCHW activations >= 1% of the step


@rule(CHANNELS_LAST)
def channels_last(a: "Analysis") -> Advice | None:
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
def bf16_without_native_bf16(a: "Analysis") -> Advice | None:
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
def fused_loss(a: "Analysis") -> Advice | None:
    """The loss (forward and its backward) takes a large share of the step.

    Gain: half the loss time (seed 000's fused focal loss, forward and backward, was
    2x faster than the composed PyTorch ops).
    """
    fwd = _steps_mean(a, "loss_ms")
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
def frozen_weight_grads(a: "Analysis") -> Advice | None:
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
def frozen_batchnorm_unfused(a: "Analysis") -> Advice | None:
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
BATCHNORM_OPS = ("aten::native_batch_norm", "aten::native_batch_norm_backward",
                 "aten::_native_batch_norm_legit", "aten::_native_batch_norm_legit_no_training")
RELU_OPS = ("aten::relu_", "aten::relu", "aten::clamp_min_", "aten::clamp_min", "aten::threshold_backward")


@rule("batchnorm_passes")
def batchnorm_passes(a: "Analysis") -> Advice | None:
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


# ------------------------------------------------------------------------- threads
OVERSUBSCRIPTION_PENALTY = 0.10  # rule of thumb: >= 10% of kernel time lost to contention


@rule("threads_vs_cores")
def threads_vs_cores(a: "Analysis") -> Advice | None:
    """The intra-op thread count differs from the physical core count.

    Gain: fewer threads than cores: the kernel share times (1 - threads/cores), as if
    kernels scaled linearly; more threads than cores: 10% of kernel time (contention).
    """
    fp = a.fingerprint
    threads, cores = fp.get("threads"), fp.get("cores")
    if not threads or not cores or int(threads) == int(cores):
        return None
    threads, cores = int(threads), int(cores)
    denom, _ = denominator(a)
    known = _compute_share(a, denom) if denom else None
    kernel_pct = 100.0 if known is None else known  # unknown: assume all of it is compute
    if threads < cores:
        gain = kernel_pct * (1.0 - threads / cores)
        what = f"uses {threads} of {cores} physical cores"
    else:
        gain = kernel_pct * OVERSUBSCRIPTION_PENALTY
        what = f"runs {threads} threads on {cores} physical cores (oversubscribed)"
    env = fp.get("env") or {}
    omp = env.get("OMP_NUM_THREADS", "unset") if isinstance(env, dict) else "unset"
    sockets = fp.get("sockets") or 1
    per_rank = f" (with several ranks: {cores} / ranks each, never spanning sockets)" if sockets > 1 else ""
    return Advice(
        rule="threads_vs_cores",
        severity=severity_for(gain),
        evidence=(
            f"torch {what}; OMP_NUM_THREADS={omp}"
            + (f"; kernels are {known:.0f}% of the step" if known is not None else "")
        ),
        estimated_gain_pct=gain,
        action=(
            f"Run one compute thread per physical core: OMP_NUM_THREADS={cores} or "
            f"torch.set_num_threads({cores}){per_rank}; pin them (OMP_PROC_BIND=close, "
            "OMP_PLACES=cores) and keep data-loader workers off those cores."
        ),
    )


# ------------------------------------------------------------------------- allocator
ALLOCATIONS_PER_STEP_MIN = 1000
ALLOCATION_SAVING_US = 1.0  # lower bound saved per call by a caching allocator
# First touch of freshly mapped memory: page faults plus the kernel zeroing each page. On a
# 2-core Intel Xeon (AMX) KVM guest, filling a fresh 64 MiB buffer took 14.8 ms against
# 4.8 ms for a reused one at 2 threads (0.155 ms/MiB; 0.185 with THP_MEM_ALLOC_ENABLE).
# The default where this machine's cached profile has no figure (`profilednn machine`
# measures it: MachineProfile.page_fault_ms_per_mib).
PAGE_FAULT_MS_PER_MIB = 0.155


def _page_fault_cost(a: "Analysis") -> tuple[float, str]:
    """ms per MiB of a freshly mapped buffer's first touch and where it comes from: this
    machine's cached profile (``profilednn machine``) for a Run captured on this CPU (advice
    never measures), else ``PAGE_FAULT_MS_PER_MIB``."""
    machine, captured_here = cached_machine_here(a)
    measured = machine.page_fault_ms_per_mib if machine is not None else None
    default = f"at {PAGE_FAULT_MS_PER_MIB} ms/MiB, a default measured on a 2-core Intel Xeon"
    if measured is None:
        return PAGE_FAULT_MS_PER_MIB, f"{default}; `profilednn machine` measures this CPU's"
    if not captured_here:
        return PAGE_FAULT_MS_PER_MIB, f"{default}: the Run was captured on another CPU than this machine's profile"
    return measured, f"at {measured:.3g} ms/MiB measured by `profilednn machine`"


FAULTS_STILL_FALLING = 0.7  # the last counted step below this share of the first: not settled yet


def _faulted_per_step(a: "Analysis") -> tuple[float, str] | None:
    """(MiB, how it was counted) that a step page-faults in, from the capture's
    ``page_faults`` record: the median of the later half of the steps after the first that
    ``torch.profiler`` did not watch (its own buffers fault too; glibc's thresholds settle
    over the first steps, so the counts fall: pytorch/examples' ImageNet script faulted 793,
    323, 288 and 160 thousand pages in its steps 1-4, and 113 thousand a step after 6);
    None when no such step was counted."""
    record = a.manifest.get("page_faults") or {}
    per_step, profiled = record.get("per_step") or [], record.get("profiled") or []
    clean = [n for g, (n, watched) in enumerate(zip(per_step, profiled)) if g > 0 and not watched]
    if not clean:
        return None
    later = clean[len(clean) // 2:]
    faults = float(statistics.median(later))
    mib = faults * float(record.get("page_bytes") or 4096) / 2**20
    falling = len(clean) > 1 and clean[-1] < FAULTS_STILL_FALLING * clean[0]
    return mib, (f"{faults:,.0f} minor page faults a step, the median of the last {len(later)} of {len(clean)} "
                 "step(s) torch.profiler did not watch"
                 + (f", still falling ({clean[0]:,} -> {clean[-1]:,}: an estimate on the high side; "
                    "more --warmup lets the allocator settle)" if falling else ""))


@rule(ALLOCATOR)
def allocator(a: "Analysis") -> Advice | None:
    """The default (glibc) allocator serves many allocations per step, or hands memory back
    to the kernel and faults it in again every step.

    Gain: 1 us saved per allocator call, plus the page faults a caching allocator (or glibc
    keeping freed memory) avoids, at the first-touch cost this machine's cached profile
    measured for a Run captured here (else ``PAGE_FAULT_MS_PER_MIB``), as a share of the
    step. Two floors of what a step faults back in, the larger counts: the faults the capture
    counted (``getrusage``, in steps the profiler did not watch: ``--light``, or warm-up
    steps after the first; they include the heap's top, trimmed and regrown), and the MiB of
    buffers above glibc's 32 MiB mmap threshold, mapped afresh every step (unmapping them
    costs too, which first-touch pricing leaves out). Runs captured before either count the
    calls only.
    """
    if str(a.fingerprint.get("allocator") or "") != "default" or not a.step_ms:
        return None
    allocs = _steps_mean(a, "allocations")
    counted = _faulted_per_step(a)
    mapped = _steps_mean(a, "mapped_alloc_mib") or 0.0
    if counted is not None and counted[0] < mapped:  # each is a floor of what a step faults back in
        counted = None
    mib = counted[0] if counted is not None else mapped
    ms_per_mib, cost_source = _page_fault_cost(a) if mib else (0.0, "")
    fault_ms = mib * ms_per_mib
    if allocs is None and not mib:
        return None
    if (allocs or 0.0) < ALLOCATIONS_PER_STEP_MIN and fault_ms < 0.01 * a.step_ms:
        return None
    gain = ((allocs or 0.0) * ALLOCATION_SAVING_US / 1000.0 + fault_ms) / a.step_ms * 100.0
    if counted is not None:
        faults = f"{mib:.0f} MiB a step page-faulted in afresh ({counted[1]}; ~{fault_ms:.0f} ms {cost_source})"
    elif mapped:
        faults = (f"{mapped:.0f} MiB a step in buffers above glibc's 32 MiB mmap threshold, mapped afresh and "
                  f"page-faulted in each time (~{fault_ms:.0f} ms {cost_source}); a floor: `profile --light` "
                  "counts every fault, the heap's too")
    else:
        faults = ""
    calls = (f"{allocs:.0f} allocator calls per step ({allocs / a.step_ms:.1f} per ms) through the default "
             "glibc malloc" if allocs is not None else "the default glibc malloc")
    return Advice(
        rule=ALLOCATOR,
        severity=severity_for(gain),
        evidence=calls + (f"; {faults}" if faults else ""),
        estimated_gain_pct=gain,
        action=(
            "Preload a caching allocator: LD_PRELOAD=libjemalloc.so.2 with "
            "MALLOC_CONF=oversize_threshold:1,background_thread:true,metadata_thp:auto, or "
            "LD_PRELOAD=libtcmalloc.so.4; both serve short-lived tensors from per-thread caches. With "
            "neither installed, GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1099511627776 "
            "keeps glibc from unmapping (and page-faulting back) every large activation each step. "
            "The `allocator` recipe measures which wins."
        ),
    )


# ------------------------------------------------------------------------- data loading
DATA_SHARE_MIN_PCT = 10.0
DATA_OVERLAP_SAVING = 0.5  # workers overlap loading with compute but share the cores


@rule("data_loading")
def data_loading(a: "Analysis") -> Advice | None:
    """Loading the batch takes a large share of the step (seed 000, 2.4).

    Gain: half the data time: workers overlap it with compute, but on a CPU they
    compete with the compute threads for the same cores.
    """
    data = _steps_mean(a, "data_ms")
    if data is None or not a.step_ms:
        return None
    share = data / a.step_ms * 100.0
    if share < DATA_SHARE_MIN_PCT:
        return None
    gain = share * DATA_OVERLAP_SAVING
    return Advice(
        rule="data_loading",
        severity=severity_for(gain),
        evidence=f"loading a batch takes {share:.1f}% of the step ({data:.2f} ms per step)",
        estimated_gain_pct=gain,
        action=(
            "Overlap loading with compute: DataLoader(num_workers=1 or 2, persistent_workers=True) "
            "and torch.set_num_threads(cores - workers); decode with Pillow-SIMD or pre-decode "
            "the dataset to tensors once."
        ),
    )


# ------------------------------------------------------------------------- fragmentation
FRAGMENT_SHARE_MIN_PCT = 5.0
FRAGMENT_OP_SAVING = 0.5  # a fused kernel: no gaps, about half the memory passes


@rule("fragmentation")
def fragmentation(a: "Analysis") -> Advice | None:
    """Long stretches of many short ops (fusion candidates) take a share of the step.

    Gain: the gaps between those ops (dispatch overhead a fused kernel removes) plus
    half the ops' own time (elementwise chains are memory bound: one pass, not many).
    """
    if a.op_events is None or not a.step_ms:
        return None
    frags = a.fragments()
    if frags.height == 0:
        return None
    span = float(frags["span_ms"].sum()) / a.n_steps
    share = span / a.step_ms * 100.0
    if share < FRAGMENT_SHARE_MIN_PCT:
        return None
    gaps = float(frags["gap_ms"].sum()) / a.n_steps
    ops = float(frags["op_ms"].sum()) / a.n_steps
    gain = (gaps + FRAGMENT_OP_SAVING * ops) / a.step_ms * 100.0
    top = frags.row(0, named=True)
    where = top["module"] or top["parent"]
    in_optimizer = top["phase"] == "optimizer"  # a per-parameter update loop: fused=True, not a compiler
    action = (f"Fuse the optimizer's per-parameter loop in {where}: construct torch's optimizer with fused=True "
              "(Adam/AdamW/SGD/Adagrad on CPU) or foreach=True, or use a fused implementation."
              if in_optimizer else
              f"Fuse the chain in {where}: torch.compile that module or function (its elementwise "
              "chains become one generated kernel), or write one kernel for it; optimizer chains "
              "go away with fused=True.")
    return Advice(
        rule="fragmentation",
        severity=severity_for(gain),
        evidence=(
            f"{frags.height / a.n_steps:.0f} stretch(es) of short ops per step cost {span:.2f} ms "
            f"({share:.1f}% of the step, {gaps:.2f} ms of it between ops); the largest: "
            f"{top['n_ops']} ops in {where} ({top['phase']}): {top['ops']}"
        ),
        estimated_gain_pct=gain,
        action=action,
        recipe=FUSED_OPTIMIZER if in_optimizer else None,
    )


def advice_json(advice: list[Advice]) -> list[dict[str, object]]:
    """The advice as plain objects (``rule``, ``severity``, ``evidence``,
    ``estimated_gain_pct``, ``action``) for ``--json``."""
    return [a.to_dict() for a in advice]


__all__ = [
    "Advice",
    "NATIVE_BF16_FLAGS",
    "Rule",
    "advice_json",
    "native_bf16",
    "severity_for",
]

"""Advice rules about number formats: BF16 where it pays on the CPU, and the loss kept in fp32.

Seed 000 (2.6): on CPUs where BF16 pays (a measured GEMM peak above fp32's, or unmeasured an
AMX matrix unit) BF16 compute is the main lever for convolutions and matmuls, and the
loss with its reductions must stay in fp32 (its wrong focal loss came from BF16 casting under
autocast). Listed in ``rules.RULE_MODULES``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from ..topology import BF16_VECTOR_FLAG
from ..vocabulary import COMPUTE_DRIVERS, GEMM_KERNEL_PATTERN
from .next_steps import run_argument
from .rulebook import Advice, cached_machine_here, denominator, per_step, rule, severity_for
from .taxonomy import is_native_op

if TYPE_CHECKING:
    from ..projection.projector import Projection
    from .view import RunView

BF16_NATIVE_SHARE_MIN_PCT = 10.0  # fp32 conv/matmul time >= 10% of the step (of oneDNN time for a log)
MACHINE_PROFILE = "this machine's profile"
ASSUMED_BF16_PEAK_RATIO = 2.0  # bf16/fp32 GEMM peak of an AMX CPU nothing measured (Intel AMX guest: 6.3x)
FP32_FIRST = r"(?i)^\[?'?float\b"  # "['float', ...]" (torch.profiler) or "[Float]": fp32 first input
# Loss-phase ops that only move or cast data: a cast of BF16 logits to fp32 is the fix, not the bug.
CAST_OPS = r"^aten::(to|_to_copy|copy_|clone|detach|view|reshape|_reshape_alias|flatten|contiguous|empty_like|empty_strided|empty|t|transpose|permute|squeeze|unsqueeze|expand|select|slice|as_strided|alias|lift_fresh|type_as)$"
CORRECTNESS_RULES = frozenset({"bf16_loss"})  # rules whose gain is correctness, not time


def _fp32_compute_ms(a: "RunView") -> float:
    """fp32 convolution/matmul time per step: oneDNN primitives plus native GEMM ops."""
    ms = 0.0
    prims = a.primitives
    if prims is not None and prims.height:
        dt = pl.col("src_dt").fill_null("f32") if "src_dt" in prims.columns else pl.lit("f32")
        ms += per_step(prims.filter(pl.col("driver").is_in(COMPUTE_DRIVERS) & (dt == "f32")), "time_ms", a)
    if a.ops is not None and a.ops.height:
        ops = a.ops.filter(pl.col("op").fill_null("").str.contains(GEMM_KERNEL_PATTERN)
                           & pl.col("dtypes").fill_null("").str.contains(FP32_FIRST))
        native = ops.with_columns(
            n=(pl.col("self_time_ms") - pl.col("onednn_ms").fill_null(0.0)).clip(lower_bound=0.0))
        ms += per_step(native, "n", a)
    return ms


def _projection(a: "RunView") -> "Projection | None":
    """The Run's stored projection, or None (a log, or a Run never projected)."""
    if a.is_log:
        return None
    from ..projection.projector import load_projection

    try:
        return load_projection(a.path)
    except (OSError, ValueError, KeyError):
        return None


def _run_isa(a: "RunView") -> frozenset[str]:
    """The ISA the advice is for: an injected CPU's, else the Run's fingerprint flags (one
    that only says ``native_bf16: true`` counts as avx512_bf16)."""
    from ..topology import cpu_topology

    if _injection():
        return cpu_topology().isa
    flags = {str(f).lower() for f in a.fingerprint.get("isa_flags") or ()}
    if not flags and a.fingerprint.get("native_bf16"):
        flags = {BF16_VECTOR_FLAG}
    return frozenset(flags)


def _measured_peaks(a: "RunView", proj: "Projection | None") -> tuple[dict[str, float] | None, str]:
    """GEMM peaks per dtype of the Run's CPU and where they come from: its projection's,
    else this machine's cached profile (``profilednn machine``) when the Run was captured on
    this CPU (advice never measures); ``(None, why not)`` otherwise."""
    stored = proj.summary.get("peak_gflops_by_dtype") if proj is not None else None
    if stored:
        return dict(stored), "the Run's projection"
    from ..hardware.machine import cached_machine_path
    from ..topology import cpu_topology

    if _injection():
        return None, "the CPU is injected"
    machine, captured_here = cached_machine_here(a)
    if not captured_here:
        here = cpu_topology().model_name
        cached = f"; this machine's cached profile is of {here}" if machine is not None else ""
        return None, f"the Run was captured on another CPU{cached}"
    if machine is None:
        return None, "no machine profile is cached for this CPU; `profilednn machine` measures one"
    when = f"measured {str(machine.measured)[:10]}, " if machine.measured else ""
    return machine.peaks, f"{MACHINE_PROFILE}, from `profilednn machine` ({when}cached in {cached_machine_path()})"


def _projected_speedup(proj: "Projection | None") -> float | None:
    """The step speedup of the same what-if as ``project --dtype bf16`` (the per-item
    roofline model), from the peaks the projection measured; None without them."""
    if proj is None:
        return None
    from ..hardware.dtypes import profile_from_peaks
    from ..projection.what_if import whatif

    peaks = proj.summary.get("peak_gflops_by_dtype") or {}
    if not peaks.get("bf16") or not peaks.get("fp32"):
        return None
    threads = int(proj.summary.get("threads") or 1)
    machine = profile_from_peaks(peaks, float(proj.summary.get("bandwidth_gbs") or 0.0) or 1.0, threads,
                                 name=str(proj.summary.get("machine") or "the projection's machine"))
    return whatif(proj, dtype="bf16", source=machine).summary.get("speedup")


def _bf16_gain(share: float, peaks: dict[str, float] | None, speedup: float | None, source: str,
               run: str = "RUN") -> tuple[float, str]:
    """(estimated gain %, how it was estimated, naming the figure and where it came from):
    the projected step speedup, else the measured peak ratio applied to the fp32 compute
    share, else the assumed ratio. ``source`` says where measured ``peaks`` came from (or
    why there are none); ``run`` is how a command names the Run."""
    ratio = peaks["bf16"] / peaks["fp32"] if peaks and peaks.get("bf16") and peaks.get("fp32") else None
    if speedup and ratio:
        return (max(0.0, (1.0 - 1.0 / speedup) * 100.0),
                f"measured bf16/fp32 GEMM peak ratio {ratio:.2f}x ({source}); `project --dtype bf16` projects "
                f"the step {speedup:.2f}x faster")
    if ratio:
        where = f"({MACHINE_PROFILE}){source.removeprefix(MACHINE_PROFILE)}" \
            if source.startswith(MACHINE_PROFILE) else f"({source})"
        return (share * (1.0 - 1.0 / ratio),
                f"measured bf16/fp32 GEMM peak ratio {ratio:.2f}x {where}, applied to that share; "
                f"`profilednn project {run}` projects the BF16 step")
    return (share * (1.0 - 1.0 / ASSUMED_BF16_PEAK_RATIO),
            f"bf16/fp32 GEMM peak ratio not measured for this Run (assumed {ASSUMED_BF16_PEAK_RATIO:.1f}x: "
            f"{source}; `profilednn project {run}` measures it and projects the BF16 step)")


@rule("bf16_native")
def bf16_native(a: "RunView") -> Advice | None:
    """fp32 convolutions/matmuls take a real share of the step on a CPU where BF16 pays.

    BF16 pays where measured GEMM peaks (the Run's projection, else this machine's cached
    profile for a Run captured here) put it above fp32, or, unmeasured, where the CPU has
    an AMX matrix unit for it (``profilednn.topology.dtype_speed``); native BF16 alone is
    not enough. The CPU is the Run's, or one injected with ``PROFILEDNN_CPU_FLAGS`` /
    ``PROFILEDNN_TOPOLOGY``. Gain: the what-if of ``project --dtype bf16`` when projected;
    otherwise the fp32 compute share s times (1 - 1/r), r the measured bf16/fp32 peak ratio
    or the assumed 2.0; the evidence names the figure used and where it came from.
    """
    from ..topology import dtype_speed

    proj = _projection(a)
    peaks, source = _measured_peaks(a, proj)
    speed = dtype_speed("bf16", _run_isa(a), peaks)
    if not speed.faster:
        return None
    denom, of_what = denominator(a)
    if not denom:
        return None
    fp32_ms = _fp32_compute_ms(a)
    share = min(fp32_ms / denom * 100.0, 100.0)
    if share < BF16_NATIVE_SHARE_MIN_PCT:
        return None
    gain, how = _bf16_gain(share, peaks, _projected_speedup(proj), source, run_argument(a))
    injected = a.fingerprint.get("isa_injected") or _injection()
    cpu = a.fingerprint.get("cpu_model") or "this CPU"
    return Advice(
        rule="bf16_native",
        severity=severity_for(gain),
        evidence=(
            f"fp32 convolutions and matmuls take {share:.1f}% {of_what} ({fp32_ms:.2f} ms per step) on a "
            f"CPU where BF16 pays ({cpu}: {speed.reason}{'; ISA injected: ' + injected if injected else ''}); "
            f"{how}"
        ),
        estimated_gain_pct=min(gain, 100.0),
        action=(
            "Run the model's compute in BF16 and keep the loss in fp32: the dtype_policy recipe (it checks "
            "that BF16 trains as well), or by hand "
            "`with torch.autocast('cpu', dtype=torch.bfloat16): out = model(x)` then "
            "`loss = loss_fn(out.float(), y)` outside the autocast block; weights and optimizer state stay fp32."
        ),
    )


def _injection() -> str | None:
    from ..topology import topology_injection

    return topology_injection()


@rule("bf16_loss")
def bf16_loss(a: "RunView") -> Advice | None:
    """The loss is computed in BF16 (its ops take BFloat16 inputs).

    BF16 keeps 8 bits of mantissa: sums over many elements and log/exp of small
    probabilities lose the signal (seed 000's wrong focal loss). A correctness finding:
    the estimated gain is 0% of the step; severity is high.
    """
    ops = a.ops
    if ops is None or ops.height == 0:
        return None
    in_loss = (pl.col("phase") == "loss") | (pl.col("module").fill_null("") == "loss")
    bf16 = ops.filter(in_loss & pl.col("dtypes").fill_null("").str.contains("BFloat16")
                      & ~pl.col("op").fill_null("").str.contains(CAST_OPS)
                      & is_native_op(pl.col("op")).fill_null(False))
    if bf16.height == 0:
        return None
    top = (bf16.group_by("op").agg(ms=pl.col("self_time_ms").sum())
           .sort(["ms", "op"], descending=[True, False]))
    names = ", ".join(top["op"].head(4).to_list()) + (f" and {top.height - 4} more" if top.height > 4 else "")
    return Advice(
        rule="bf16_loss",
        severity="high",
        evidence=(f"{top.height} loss op(s) compute on BFloat16 inputs ({names}; "
                  f"{per_step(bf16, 'self_time_ms', a):.3f} ms per step)"),
        estimated_gain_pct=0.0,
        action=(
            "Compute the loss in fp32: cast the model's outputs before it "
            "(`loss = loss_fn(out.float(), y)`, outside the torch.autocast block), or call "
            "`torch.autocast('cpu', enabled=False)` around the loss; the dtype_policy recipe does this."
        ),
    )


__all__ = ["ASSUMED_BF16_PEAK_RATIO", "BF16_NATIVE_SHARE_MIN_PCT", "CORRECTNESS_RULES", "bf16_loss",
           "bf16_native"]

"""The rows any CPU can answer: its peaks, optimize of a small convnet and a small
transformer (judged per BF16 tier), the step model on its own step and on a thread
what-if, and two kernels against their peers."""

from __future__ import annotations

import statistics
import tempfile
import time
from typing import Any

from .host import Host
from .rows import Row

PART = "any CPU"
# a peak is the best repeat; when the median repeat falls more than this far below it, the
# machine was busy or drifting while it was measured, and the rows below lean on these peaks
PEAK_SPREAD = 0.15
# bf16 GEMM peak over fp32's that each tier's silicon gives at least (AMX: 6.3x measured
# on the Intel guest; avx512_bf16: 2.2x on Zen 4); "none": BF16 must not be treated as faster
TIER_BF16_GAIN = {"amx": 3.0, "avx512_bf16": 1.5}
# total speedup floors of optimize on the small models, per tier (the full-size targets of
# bench_optimize.py are higher: resnet50 4.0x on AMX, 2.5x avx512_bf16, 1.4x without)
OPTIMIZE_FLOOR = {"amx": 1.5, "avx512_bf16": 1.2, "none": 1.0}
OWN_STEP_PCT, WHATIF_PCT = 10.0, 15.0  # the step model's targets (README "Project")
FOCAL_TARGET, LAMB_BOUND = 1.5, 1.25  # bench_focal_loss.py's and bench_fused_lamb.py's targets


def _spread(m: Any) -> float:
    """How far the median repeat falls below the best one (a share of the best)."""
    return (m.max - m.median) / m.max if m.max else float("inf")


def peaks(host: Host, quick: bool) -> list[Row]:
    """Measure the machine afresh (and cache it for the checks after this one)."""
    from profilednn.hardware.machine import get_machine

    prof = get_machine(refresh=True)
    rows = []
    fp32 = prof.gemm["fp32"][max(prof.gemm["fp32"])]
    rows.append(Row.judged(PART, "peaks", f"fp32 GEMM peak: median repeat within {PEAK_SPREAD:.0%} of the best",
                           _spread(fp32) <= PEAK_SPREAD,
                           f"{fp32.max:.0f} GFLOP/s (median {fp32.median:.0f}, {fp32.min:.0f}-{fp32.max:.0f}) "
                           f"at {max(prof.gemm['fp32'])} threads", fp32.max,
                           reason=f"median {_spread(fp32):.0%} below the best"))
    bf16 = prof.gemm.get("bf16", {})
    ratio = (bf16[max(bf16)].max / fp32.max) if bf16 else None
    if host.tier == "none":
        ok = "bf16" not in prof.faster_dtypes()
        figure = "bf16 not measured as faster" if ok else f"bf16 {ratio:.2f}x fp32"
        rows.append(Row.judged(PART, "peaks", "BF16 as the tier says: not faster than fp32 (no native BF16)",
                               ok, figure, ratio))
    else:
        need = TIER_BF16_GAIN[host.tier]
        rows.append(Row.judged(PART, "peaks", f"BF16 as the tier says: bf16 GEMM >= {need}x fp32 ({host.tier})",
                               ratio is not None and ratio >= need,
                               f"bf16 {ratio:.2f}x fp32" if ratio else "bf16 not measured", ratio))
    bw = prof.bandwidth[max(prof.bandwidth)]
    rows.append(Row.judged(PART, "peaks", f"STREAM triad: median repeat within {PEAK_SPREAD:.0%} of the best",
                           _spread(bw) <= PEAK_SPREAD,
                           f"{bw.max:.1f} GB/s (median {bw.median:.1f}, {bw.min:.1f}-{bw.max:.1f})", bw.max,
                           reason=f"median {_spread(bw):.0%} below the best"))
    return rows


# (workload, build arguments, quick build arguments)
CONVNET = ("resnet50", {"batch_size": 8, "image_size": 96}, {"batch_size": 4, "image_size": 32})
TRANSFORMER = ("bert_base", {"batch_size": 8, "seq_len": 128, "layers": 2, "hidden": 256, "heads": 4},
               {"batch_size": 2, "seq_len": 16, "layers": 1, "hidden": 64, "heads": 2})
# torch.compile is left out: compiling forward and backward alone takes 1-2 minutes on 2 cores
VERIFY_RECIPES_SKIP = ("torch_compile",)


def _optimize(host: Host, check: str, case: tuple, quick: bool) -> list[Row]:
    from profilednn.optimization import Settings
    from profilednn.optimization.recipes import load_recipes
    from profilednn.optimization.workload import optimize_workload

    name, knobs, quick_knobs = case
    recipes = [r for r in load_recipes() if r not in VERIFY_RECIPES_SKIP]
    settings = Settings(rounds=2 if quick else 3, numerics_steps=2, child_runs=1, child_steps=2,
                        env_warmup=2, headroom=False, precision_steps=4, digits_epochs=3)
    with tempfile.TemporaryDirectory(prefix="verify-optimize-") as runs:
        _, result = optimize_workload(name, runs, recipes, settings=settings,
                                      **(quick_knobs if quick else knobs))
    rep = result.report
    label = f"{name} {quick_knobs if quick else knobs}"
    floor = OPTIMIZE_FLOOR[host.tier]
    rows = [Row.judged(PART, check, f"total speedup over stock fp32 eager >= {floor}x ({host.tier} tier)",
                       bool(rep.speedup) and rep.speedup >= floor,
                       (f"{rep.speedup:.2f}x ({rep.baseline.median_ms:.1f} -> {rep.final.median_ms:.1f} ms); "
                        f"accepted: {', '.join(rep.accepted) or 'none'}") if rep.speedup else "no final A/B",
                       rep.speedup, reason=label, accepted=list(rep.accepted),
                       recipes={r.recipe: {"applies": r.applies, "accepted": r.accepted, "speedup": r.speedup,
                                           "reason": r.reason[:200]} for r in rep.recipes})]
    bf16 = next((r for r in rep.recipes if r.recipe == "dtype_policy"), None)
    if host.tier == "none":
        ok = bf16 is not None and not bf16.applies
        rows.append(Row.judged(PART, check, "BF16 (dtype_policy) ruled out before any run: no native BF16", ok,
                               f"skipped: {bf16.reason[:120]}" if ok else
                               (f"tried ({bf16.decision[:120]})" if bf16 else "dtype_policy not listed")))
    else:
        ok = bf16 is not None and bf16.accepted
        rows.append(Row.judged(PART, check, f"BF16 (dtype_policy) accepted on native BF16 ({host.tier})", ok,
                               (f"{bf16.speedup:.2f}x, numerics {bf16.numerics}" if bf16 and bf16.speedup else
                                (bf16.reason[:120] if bf16 else "dtype_policy not listed"))))
    fin = rep.final_numerics
    rows.append(Row.judged(PART, check, "optimized setup trains as stock does (final numerics)",
                           fin is not None and fin.verdict == "pass",
                           f"{fin.verdict}: {fin.detail[:120]}" if fin else "no final numerics"))
    return rows


def optimize_convnet(host: Host, quick: bool) -> list[Row]:
    return _optimize(host, "optimize_convnet", CONVNET, quick)


def optimize_transformer(host: Host, quick: bool) -> list[Row]:
    return _optimize(host, "optimize_transformer", TRANSFORMER, quick)


def step_model_rows(check: str, part: str, v: Any, what_if: str, target_pct: float) -> list[Row]:
    """The own-step row and the what-if row of one ``projection.validate`` result."""
    s = v.summary
    own, err = s.get("own_error"), s.get("error")
    spread = {k: _step_spread(s[f"run_{k}"]) for k in ("a", "b")}
    parts = v.by_part.to_dicts()
    return [
        Row.judged(part, check, f"own step projected within {OWN_STEP_PCT:.0f}%",
                   own is not None and abs(own) * 100 <= OWN_STEP_PCT,
                   f"{s['own_projected_step_ms']:.1f} ms projected vs {s['measured_a_step_ms']:.1f} measured "
                   f"({100 * own:+.1f}%; measured steps {spread['a']})" if own is not None else "no projection",
                   own),
        Row.judged(part, check, f"{what_if} within {target_pct:.0f}% of the measured step",
                   err is not None and abs(err) * 100 <= target_pct,
                   f"{s['predicted_b_step_ms']:.1f} ms predicted vs {s['measured_b_step_ms']:.1f} measured "
                   f"({100 * err:+.1f}%; measured steps {spread['b']})" if err is not None else "no prediction",
                   err, by_part=parts),
    ]


def _step_spread(run_path: str) -> str:
    """The measured steps' range, "min-max ms": how much of an error the noise alone makes."""
    from profilednn.run import load_run

    times = load_run(run_path).table("steps")["time_ms"].to_list()
    return f"{min(times):.0f}-{max(times):.0f} ms" if times else "none"


PROJECTION = ("resnet50", {"batch_size": 8, "image_size": 64}, {"batch_size": 2, "image_size": 32})
STEPS = 5  # measured steps per Run: on a shared 2-core guest single steps vary by 20%


def projection(host: Host, quick: bool) -> list[Row]:
    """Profile at all cores, project the own step and the step at half the threads, profile there."""
    import torch

    from profilednn.capture.runners import profile_builtin
    from profilednn.projection.validate import validate

    name, knobs, quick_knobs = PROJECTION
    knobs = quick_knobs if quick else knobs
    threads = min(host.cores, torch.get_num_threads())
    half = max(1, threads // 2)
    with tempfile.TemporaryDirectory(prefix="verify-projection-") as runs:
        run = profile_builtin(name, runs, steps=STEPS, warmup=1, threads=threads, **knobs)
        v = validate(run, threads=half, runs_dir=runs, steps=STEPS, budget_s=0.1 if quick else 0.25)
        return step_model_rows("projection", PART, v, f"threads {threads} -> {half} what-if", WHATIF_PCT)


def _focal_row(quick: bool, bw_gbs: float) -> Row:
    import torch
    import torchvision

    from profilednn.kernels import sigmoid_focal_loss
    from profilednn.optimization.abtest import interleaved

    shape = (2, 4_000 if quick else 40_000, 264)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(shape, generator=g) * 3 - 4
    targets = (torch.rand(shape, generator=g) < 0.001).float()
    compiled = torch.compile(torchvision.ops.sigmoid_focal_loss)

    def arm(fn: Any) -> Any:
        def step() -> None:
            x = logits.detach().clone().requires_grad_()
            fn(x, targets, alpha=0.25, gamma=2.0, reduction="sum").backward()
        return step

    # the warm-up step of each arm compiles torchvision's loss and builds the native kernel
    ab = interleaved(arm(compiled), arm(lambda *a, **k: sigmoid_focal_loss(*a, backend="native", **k)),
                     rounds=3 if quick else 7)
    compiled_ms, native_ms = ab.before.median_ms, ab.after.median_ms
    floor_ms = logits.numel() * 12 / (bw_gbs * 1e9) * 1e3  # read logits and targets, write the gradient
    return Row.judged(PART, "kernels", f"focal loss fwd+bwd: native >= {FOCAL_TARGET}x torch.compile of torchvision's",
                      ab.speedup >= FOCAL_TARGET,
                      f"{ab.speedup:.2f}x ({compiled_ms:.1f} vs {native_ms:.1f} ms; "
                      f"{native_ms / floor_ms:.1f}x the bandwidth floor)", ab.speedup, reason=f"shape {list(shape)}")


def _lamb_row(quick: bool, bw_gbs: float) -> Row:
    import torch

    from profilednn.kernels import FusedLAMB

    sizes = [(256, 256)] * 8 if quick else [(1024, 1024)] * 24 + [(1024,)] * 48
    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in sizes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * 1e-2
    opt = FusedLAMB(params, lr=1e-3, weight_decay=0.01)
    opt.step()  # state allocated
    times = []
    for _ in range(3 if quick else 9):
        t0 = time.perf_counter()
        opt.step()
        times.append((time.perf_counter() - t0) * 1e3)
    med = statistics.median(times)
    n = sum(p.numel() for p in params)
    bound_ms = 7 * 4 * n / (bw_gbs * 1e9) * 1e3  # read p, g, m, v; write p, m, v (fp32)
    return Row.judged(PART, "kernels", f"LAMB step <= {LAMB_BOUND}x its 7-stream bandwidth bound",
                      med <= LAMB_BOUND * bound_ms,
                      f"{med:.2f} ms = {med / bound_ms:.2f}x the bound ({bound_ms:.2f} ms at {bw_gbs:.1f} GB/s; "
                      f"{opt.backend_used} path)", med / bound_ms, reason=f"{n / 1e6:.1f} M values")


def kernels(host: Host, quick: bool) -> list[Row]:
    from profilednn.hardware.machine import get_machine

    bw = get_machine().bandwidth_gbs
    return [_focal_row(quick, bw), _lamb_row(quick, bw)]


__all__ = ["kernels", "optimize_convnet", "optimize_transformer", "peaks", "projection", "step_model_rows"]

"""``profilednn optimize`` against the speed targets of the AMX-class issue, per CPU class.

For each model, ``optimize_workload`` runs every built-in recipe (as ``profilednn optimize
--model M`` does) and writes a Run; the figures printed are the report's own: each recipe's
interleaved A/B and verdict, the final stock-fp32-eager vs optimized total (in child
processes when a launch environment won, so it counts), the optimized step's MFU against
each dtype's measured GEMM peak, and where the optimized step goes (headroom by op family).
The target depends on what the CPU computes BF16 with (AMX, AVX-512 BF16, or nothing);
targets for another class are printed as "not measured here".

    .venv/bin/python benchmarks/bench_optimize.py                       # resnet50, retinanet, bert_base
    .venv/bin/python benchmarks/bench_optimize.py --only resnet50 --rounds 5
    .venv/bin/python benchmarks/bench_optimize.py --kernel               # fused BN+ReLU vs stock vs compile

``--kernel`` times the fused batch-norm kernel (``profilednn.kernels.FusedBatchNorm2d`` with
its ReLU) against stock eager and against ``torch.compile`` of the stock modules, forward +
backward at ResNet-50's BF16 channels_last shapes, interleaved in one process.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from profilednn.interrupts import signals_as_interrupts
from profilednn.optimization import Settings
from profilednn.optimization.workload import optimize_workload
from profilednn.topology import bf16_tier, cpu_topology, isa_cap_note

# (model, build arguments, {cpu class: minimum speedup over stock fp32 eager}, MFU target on AMX)
CASES = {
    "resnet50": ({"batch_size": 16, "image_size": 224}, {"amx": 4.0, "avx512_bf16": 2.5, "none": 1.4}, 0.25),
    "retinanet": ({"batch_size": 2, "image_size": 512, "num_classes": 264, "trainable_layers": 3},
                  {"amx": 5.5, "avx512_bf16": 2.5, "none": 1.3}, None),
    "bert_base": ({}, {"amx": 3.0}, None),
}
WORKLOAD = {"retinanet": "retinanet_resnext50_fpn"}


def cpu_class() -> str:
    """What this process computes BF16 with: "amx", "avx512_bf16" or "none" (within
    ``ONEDNN_MAX_CPU_ISA``'s cap: the kernels of that class, run by this CPU)."""
    return bf16_tier(cpu_topology().isa)


def print_recipes(report) -> None:
    for r in report.recipes:
        if not r.applies:
            print(f"  {r.recipe:20} skipped   {r.reason}")
            continue
        figures = (f"{r.before_ms:8.1f} -> {r.after_ms:8.1f} ms ({r.speedup:.2f}x)" if r.speedup else "")
        verdict = "ACCEPTED" if r.accepted else "rejected"
        second = " (second pass" + r.decision.split("(second pass", 1)[1] if "(second pass" in r.decision else ""
        print(f"  {r.recipe:20} {verdict:9} {figures}  numerics {r.numerics}{second}"
              + ("" if r.accepted else f"\n  {'':20} {r.decision[:200]}"))


def bench_model(key: str, args: argparse.Namespace, runs_dir: Path) -> bool:
    build_args, targets, mfu_target = CASES[key]
    name = WORKLOAD.get(key, key)
    klass, capped = cpu_class(), isa_cap_note()
    print(f"\n== {name} {build_args}, threads {torch.get_num_threads()}, CPU class {klass}"
          + (f" EMULATED ({capped}): this class's kernels on this CPU, not such a CPU" if capped else ""),
          flush=True)
    settings = Settings(rounds=args.rounds, numerics_steps=args.numerics_steps, child_runs=args.child_runs,
                        child_steps=args.child_steps)
    t0 = time.time()
    try:
        run, result = optimize_workload(name, runs_dir, None, settings=settings,
                                        progress=lambda m: print(f"  [{time.time() - t0:5.0f}s] {m}", flush=True),
                                        **build_args)
    except KeyboardInterrupt as exc:  # Ctrl-C, or `timeout`'s SIGTERM: print what the Run kept
        kept = getattr(exc, "run", None)
        if kept is not None and kept.has_table("optimize_recipes"):
            print(f"  stopped after {time.time() - t0:.0f} s; the recipes measured so far (Run {kept.path}):")
            for row in kept.table("optimize_recipes").iter_rows(named=True):
                print(f"  {row['recipe']:20} {row['decision'][:160]}")
        raise
    report = result.report
    print_recipes(report)
    b, f = report.baseline, report.final
    if b is None or f is None or not report.speedup:
        print("  no final A/B")
        return False
    print(f"  stock fp32 eager   median {b.median_ms:9.1f} ms (min {b.min_ms:.1f}, max {b.max_ms:.1f}, "
          f"{len(b.samples_ms)} steps)")
    print(f"  optimized          median {f.median_ms:9.1f} ms (min {f.min_ms:.1f}, max {f.max_ms:.1f}, "
          f"{len(f.samples_ms)} steps)   [{report.final_measured_in}]")
    if report.launch_prefix():
        print(f"  launch environment: {report.launch_prefix()}")
    mfu = report.mfu_final
    peaks = report.peak_gflops_by_dtype or {}
    print(f"  model FLOPs/step {sum((report.flops_by_dtype_final or {}).values()) / 1e9:.1f} GFLOP "
          f"{report.flops_by_dtype_final}; peaks {({k: round(v) for k, v in peaks.items()})} GFLOP/s; "
          f"MFU stock {report.mfu_baseline or 0:.1%}, optimized {mfu or 0:.1%}")
    if report.headroom is not None:
        h = report.headroom
        print(f"  where the optimized step goes: " + ", ".join(
            f"{row['family']} {row['ms_per_step']:.0f} ms ({row['share_pct']:.0f}%)"
            for row in h.table().iter_rows(named=True)))
    ok = True
    for klass_t, target in targets.items():
        if klass_t != klass:
            print(f"  target >= {target}x on {klass_t}: not measured here ({klass} CPU)")
            continue
        met = report.speedup >= target
        ok &= met
        print(f"  speedup {report.speedup:.2f}x over stock fp32 eager (target >= {target}x on {klass}: "
              f"{'met' if met else 'MISSED'}{' on the emulated ISA only' if capped else ''})")
    if mfu_target is not None:
        if klass == "amx":
            met = bool(mfu) and mfu >= mfu_target
            ok &= met
            print(f"  MFU {mfu or 0:.1%} of the BF16 peak (target >= {mfu_target:.0%} on amx: "
                  f"{'met' if met else 'MISSED'})")
        else:
            print(f"  MFU target >= {mfu_target:.0%} on amx: not measured here ({klass} CPU)")
    print(f"  Run: {run.path}  ({time.time() - t0:.0f} s)")
    return ok


# ------------------------------------------------------------------------------ the kernel
RESNET50_BN_SHAPES = ((16, 64, 112, 112), (16, 256, 56, 56), (16, 512, 28, 28), (16, 1024, 14, 14))


def _fwd_bwd(fn, x: torch.Tensor, g: torch.Tensor) -> None:
    xx = x.detach().requires_grad_()
    fn(xx).backward(g)


def bench_kernel(args: argparse.Namespace) -> bool:
    from profilednn.kernels.batch_norm import FusedBatchNorm2d

    print(f"\n== fused BN+ReLU kernel vs stock eager vs torch.compile(stock), bf16 channels_last, "
          f"threads {torch.get_num_threads()}", flush=True)
    ok = True
    for shape in RESNET50_BN_SHAPES:
        c = shape[1]
        stock = nn.Sequential(nn.BatchNorm2d(c), nn.ReLU(inplace=True))
        fused = FusedBatchNorm2d.from_batch_norm(copy.deepcopy(stock[0]), relu=True)
        compiled = torch.compile(copy.deepcopy(stock))
        x = torch.randn(shape).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
        g = torch.randn(shape).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
        arms = {"stock eager": stock, "torch.compile(stock)": compiled, "fused kernel": fused}
        for fn in arms.values():
            for _ in range(3):
                _fwd_bwd(fn, x, g)
        times: dict[str, list[float]] = {k: [] for k in arms}
        for r in range(args.kernel_rounds):
            for name in arms if r % 2 == 0 else reversed(list(arms)):
                t = time.perf_counter()
                _fwd_bwd(arms[name], x, g)
                times[name].append((time.perf_counter() - t) * 1e3)
        med = {k: statistics.median(v) for k, v in times.items()}
        spread = {k: f"{min(v):.2f}-{max(v):.2f}" for k, v in times.items()}
        print(f"  {str(list(shape)):20} " + "  ".join(f"{k} {med[k]:6.2f} ms ({spread[k]})" for k in arms)
              + f"  fused vs stock {med['stock eager'] / med['fused kernel']:.2f}x, vs compile "
              f"{med['torch.compile(stock)'] / med['fused kernel']:.2f}x")
        ok &= med["fused kernel"] < med["torch.compile(stock)"]
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=list(CASES), action="append", help="models to run (default: all)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved A/B rounds per recipe")
    ap.add_argument("--numerics-steps", type=int, default=3)
    ap.add_argument("--child-runs", type=int, default=2)
    ap.add_argument("--child-steps", type=int, default=3)
    ap.add_argument("--kernel", action="store_true", help="only the fused batch-norm kernel comparison")
    ap.add_argument("--kernel-rounds", type=int, default=15)
    ap.add_argument("-o", "--runs", default=None, help="runs directory (default: a temporary one)")
    args = ap.parse_args()
    if args.kernel:
        return 0 if bench_kernel(args) else 1
    ok = True
    with signals_as_interrupts(), tempfile.TemporaryDirectory(prefix="bench-optimize-") as tmp:
        runs_dir = Path(args.runs or tmp)
        for key in args.only or list(CASES):
            ok &= bench_model(key, args, runs_dir)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

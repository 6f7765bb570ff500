"""``profilednn optimize -- python train.py`` against the targets of issue 29.

(a) ``benchmarks/scripts/resnet50_train.py`` (the built-in resnet50 written as a user's
    script, batch 16, 224) optimized through ``-- python``, beside ``optimize --model
    resnet50``: accepted recipes and total speedup of each (target: the same recipes, the
    speedup within 10 %).
(b) ``benchmarks/scripts/gpt_train.py`` (a small GPT-style causal LM: AdamW, LayerNorm, GELU,
    SDPA attention, char-level synthetic text): stock vs optimized (target on a native-BF16
    CPU: >= 1.5x with BF16 accepted; without native BF16: BF16 skipped with its reason).
(c) Injection overhead: the stock script's step under the observation layer and the
    injector (no recipe) against a plain run (one optimizer hook that only notes step ends),
    child processes interleaved (target: <= 3 %).
(d) Estimated vs measured gain of every accepted recipe: each workload is profiled first
    (``profilednn profile``) and its advice's ``estimated_gain_pct`` is held against the
    ``measured_gain_pct`` of the recipe's own A/B; the median absolute error.

Run it alone on an idle machine (the arms are timed):

    .venv/bin/python benchmarks/bench_optimize_script.py                       # everything
    .venv/bin/python benchmarks/bench_optimize_script.py --only gpt --rounds 3 --steps 5
    .venv/bin/python benchmarks/bench_optimize_script.py --tiny                # a quick check that it runs
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from profilednn.optimization import Settings
from profilednn.optimization.abtest import Timing
from profilednn.optimization.results import OptimizeReport
from profilednn.optimization.script import optimize_script
from profilednn.optimization.script.runner import run_arm_process
from profilednn.optimization.workload import optimize_workload
from profilednn.topology import bf16_tier, detected_topology

HERE = Path(__file__).resolve().parent
RESNET = HERE / "scripts" / "resnet50_train.py"
GPT = HERE / "scripts" / "gpt_train.py"


def cpu_class() -> str:
    return bf16_tier(detected_topology().isa)


def profile_run(argv: list[str], runs: Path, steps: int, warmup: int) -> Path | None:
    """``profilednn profile`` of a script or built-in model; the Run's path (None if it failed)."""
    done = subprocess.run([sys.executable, "-m", "profilednn", "profile", "-o", str(runs), "--steps", str(steps),
                           "--warmup", str(warmup), *argv], capture_output=True, text=True, check=False)
    found = re.findall(r"^Run: (\S+)", done.stdout, flags=re.M)
    if done.returncode != 0 or not found:
        print(f"  profile failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
        return None
    return Path(found[-1])


def describe(report: OptimizeReport) -> str:
    accepted = [f"{r.recipe} {r.speedup:.2f}x" for r in report.recipes if r.accepted and r.speedup]
    total = f"{report.speedup:.2f}x" if report.speedup else "n/a"
    if report.speedup and report.baseline and report.final:
        total += (f" = {report.baseline.median_ms:.1f} ms ({report.baseline.spread()}) -> {report.final.median_ms:.1f} ms "
                  f"({report.final.spread()})")
    return f"accepted: {', '.join(accepted) or 'none'}; total {total} ({report.final_measured_in or 'no final A/B'})"


def print_rows(report: OptimizeReport) -> None:
    for r in report.recipes:
        verdict = "ACCEPTED" if r.accepted else ("rejected" if r.applies else "skipped")
        figures = f"{r.before_ms:8.1f} -> {r.after_ms:8.1f} ms ({r.speedup:.2f}x)" if r.speedup else ""
        print(f"  {r.recipe:20} {verdict:9} {figures:32} {(r.decision if r.applies else r.reason)[:110]}")


def script_settings(args: argparse.Namespace) -> Settings:
    return Settings.for_script(warmup=args.warmup, child_steps=args.steps, rounds=args.rounds)


def part_a(args: argparse.Namespace, runs: Path, gains: list[tuple[str, str, float | None, float | None]]) -> None:
    size = ["--batch-size", str(args.batch_size), "--image-size", str(args.image_size)]
    window = args.warmup + args.steps
    print(f"(a) resnet50 b{args.batch_size} {args.image_size}: built-in vs the same as a script")
    builtin_profile = profile_run(["--model", "resnet50", *size], runs, 2, 1) if args.gains else None
    _, builtin = optimize_workload("resnet50", runs, settings=Settings(rounds=args.rounds, warmup=args.warmup,
                                                                          child_steps=args.steps),
                                   profile=builtin_profile, batch_size=args.batch_size, image_size=args.image_size)
    print_rows(builtin.report)
    argv = ["python", str(RESNET), *size, "--steps", "100000"]
    script_profile = (profile_run(["--", "python", str(RESNET), *size, "--steps", str(max(window, 3))], runs, 2, 1)
                      if args.gains else None)
    _, script = optimize_script(argv, runs, settings=script_settings(args), profile=script_profile,
                                stdout=subprocess.DEVNULL)
    print_rows(script)
    print(f"  built-in: {describe(builtin.report)}")
    print(f"  script:   {describe(script)}")
    same = sorted(builtin.report.accepted) == sorted(script.accepted)
    ratio = (script.speedup / builtin.report.speedup) if script.speedup and builtin.report.speedup else None
    print(f"  same recipes accepted: {'yes' if same else 'no'}; script speedup / built-in speedup: "
          + (f"{ratio:.3f} (target within 10 %: {'met' if abs(ratio - 1) <= 0.10 else 'missed'})" if ratio else "n/a"))
    gains += [("resnet50 built-in", r.recipe, r.estimated_gain_pct, r.measured_gain_pct)
              for r in builtin.report.recipes if r.accepted]
    gains += [("resnet50 script", r.recipe, r.estimated_gain_pct, r.measured_gain_pct)
              for r in script.recipes if r.accepted]


def gpt_argv(args: argparse.Namespace, steps: int) -> list[str]:
    shape = ["--n-layer", "1", "--n-embd", "64", "--block-size", "32", "--batch-size", "4"] if args.tiny else []
    return ["python", str(GPT), *shape, "--steps", str(steps)]


def part_b(args: argparse.Namespace, runs: Path, gains: list[tuple[str, str, float | None, float | None]]) -> None:
    cls = cpu_class()
    print(f"(b) GPT-style char LM script ({cls} CPU)")
    window = args.warmup + args.steps
    profile = profile_run(["--", *gpt_argv(args, max(window, 3))], runs, 2, 1) if args.gains else None
    _, report = optimize_script(gpt_argv(args, 100000), runs, settings=script_settings(args), profile=profile,
                                stdout=subprocess.DEVNULL)
    print_rows(report)
    print(f"  {describe(report)}")
    bf16 = next((r for r in report.recipes if r.recipe == "dtype_policy"), None)
    if cls == "none":
        print(f"  target (no native BF16): BF16 skipped with its reason: "
              f"{'met' if bf16 is not None and not bf16.applies else 'missed'} ({bf16.reason if bf16 else 'no row'})")
    else:
        met = bool(report.speedup and report.speedup >= 1.5 and bf16 is not None and bf16.accepted)
        print(f"  target ({cls}): >= 1.5x with BF16 accepted: {'met' if met else 'missed'}")
    gains += [("gpt script", r.recipe, r.estimated_gain_pct, r.measured_gain_pct) for r in report.recipes if r.accepted]


def part_c(args: argparse.Namespace) -> None:
    print("(c) injection overhead: observed (observation layer + injector, no recipe) vs plain, interleaved")
    for name, argv in (("gpt", gpt_argv(args, 100000)),
                       ("resnet50", ["python", str(RESNET), "--batch-size", str(args.batch_size), "--image-size",
                                     str(args.image_size), "--steps", "100000"])):
        if args.only and args.only != name:
            continue
        spec = {"argv": argv, "recipes": [], "seed": 0, "warmup": args.warmup, "steps": args.steps}
        plain: list[float] = []
        observed: list[float] = []
        for i in range(args.rounds):
            for observe in ((False, True) if i % 2 == 0 else (True, False)):
                out = run_arm_process({**spec, "observe": observe}, {}, timeout_s=3600, stdout=subprocess.DEVNULL)
                (observed if observe else plain).extend(out.times_ms)
        a, b = Timing(tuple(plain)), Timing(tuple(observed))
        overhead = 100.0 * (b.median_ms / a.median_ms - 1.0)
        print(f"  {name:9} plain {a.median_ms:9.1f} ms ({a.spread()})  observed {b.median_ms:9.1f} ms ({b.spread()})  "
              f"overhead {overhead:+.1f}% (target <= 3%: {'met' if overhead <= 3.0 else 'missed'})")


def part_d(gains: list[tuple[str, str, float | None, float | None]]) -> None:
    print("(d) estimated (advice) vs measured gain of each accepted recipe, percent of the step")
    errors = []
    for where, recipe, est, meas in gains:
        shown = lambda v: "n/a" if v is None else f"{v:.1f}%"  # noqa: E731
        print(f"  {where:18} {recipe:20} estimated {shown(est):>7}  measured {shown(meas):>7}")
        if est is not None and meas is not None:
            errors.append(abs(est - meas))
    print(f"  median absolute error: {statistics.median(errors):.1f} points over {len(errors)} recipes"
          if errors else "  no accepted recipe had an advice estimate")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=("resnet50", "gpt"), default=None)
    parser.add_argument("--rounds", type=int, default=3, help="child processes per arm")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--no-gains", dest="gains", action="store_false", help="skip the profiles of (d)")
    parser.add_argument("--tiny", action="store_true",
                        help="a quick check that it runs: 1 round, 2+1 steps, resnet50 b2 64 px, a one-layer GPT")
    args = parser.parse_args()
    if args.tiny:
        args.rounds, args.warmup, args.steps, args.batch_size, args.image_size = 1, 2, 1, 2, 64
    print(f"CPU: {detected_topology().model_name} ({cpu_class()}); {args.rounds} child processes per arm, "
          f"window {args.warmup} + {args.steps} steps")
    gains: list[tuple[str, str, float | None, float | None]] = []
    with tempfile.TemporaryDirectory(prefix="bench-optimize-script-") as tmp:
        runs = Path(tmp) / "runs"
        if args.only in (None, "resnet50"):
            part_a(args, runs, gains)
        if args.only in (None, "gpt"):
            part_b(args, runs, gains)
        part_c(args)
    part_d(gains)
    return 0


if __name__ == "__main__":
    sys.exit(main())

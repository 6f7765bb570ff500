"""Does ``optimize`` decide with confidence? Repeat it, compare it with the fixed-rounds search,
and give it a recipe that changes nothing.

``--repeat N`` runs ``profilednn optimize ... --json`` N times back to back on one workload (a
built-in ``--model`` with its sizes, or a script after ``--``) and checks that the runs accept
the same recipes apart from those inconclusive in either, and that each total speedup lies
inside the other runs' intervals. ``--baseline-ref REF`` also runs the CLI of an older commit
(a git worktree of REF, e.g. the last fixed-rounds search, ``0002192``) once, first, with the
same workload and its own default settings: its wall time and accepted set against the new
runs'. ``--a-vs-a N`` (a built-in model) runs the search N times with one recipe that changes
nothing: it must never be accepted. ``--noisier-b SD`` makes that recipe's arm noisier without
changing its mean: both arms wait ``--stall-ms`` a step (in the loss function, which changes no
arithmetic), A exactly, B a seeded lognormal amount of the same mean scattering SD (0.4: 40%),
the case the pooled noise alone would accept too often (docs/optimize.md); run it with
``PYTHONPATH`` set to an older tree's ``src`` to compare.

    .venv/bin/python benchmarks/bench_optimize_confidence.py --repeat 2 --baseline-ref 0002192 \\
        --model resnet50 --batch-size 16 --image-size 224
    .venv/bin/python benchmarks/bench_optimize_confidence.py --repeat 2 --baseline-ref 0002192 \\
        -- python benchmarks/scripts/gpt_train.py --steps 30
    .venv/bin/python benchmarks/bench_optimize_confidence.py --a-vs-a 5 --model resnet50 --image-size 112
    .venv/bin/python benchmarks/bench_optimize_confidence.py --a-vs-a 20 --model small_cnn --noisier-b 0.4

Run it with nothing else on the machine: wall times and speedups are what it compares.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from profilednn.optimization.intervals import noise_line, outcome

ROOT = Path(__file__).resolve().parents[1]


def _optimize(cli_src: Path, workload: list[str], extra: list[str], runs: Path) -> tuple[dict[str, Any], float]:
    """One ``profilednn optimize --json`` with the CLI of ``cli_src``: its report and wall seconds."""
    model, script = (workload, []) if "--" not in workload else (workload[:workload.index("--")],
                                                                  workload[workload.index("--"):])
    log = ["--script-log", str(runs.parent / "script.log")] if script else []  # keeps stdout to the JSON
    cmd = [sys.executable, "-m", "profilednn", "optimize", *model, *extra, *log, "--json", "-o", str(runs), *script]
    env = {**os.environ, "PYTHONPATH": str(cli_src)}
    started = time.monotonic()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"optimize failed ({done.returncode}): {done.stderr.strip().splitlines()[-3:]}")
    return json.loads(done.stdout), wall


def _describe(label: str, report: dict[str, Any], wall: float) -> None:
    total, ci = report.get("speedup"), report.get("speedup_ci")
    figure = "n/a" if total is None else f"{total:.3f}x" + (f" [{ci[0]:.3f}-{ci[1]:.3f}]" if ci else "")
    print(f"\n{label}: wall {wall / 60:.1f} min, total {figure}, accepted {report['accepted']}")
    if report.get("a_vs_a"):
        print(f"  {noise_line(report['a_vs_a'])}")
    for r in report["recipes"]:
        if not r["applies"]:
            continue
        ci = r.get("speedup_ci")
        speed = "n/a" if r["speedup"] is None else f"{r['speedup']:.3f}x"
        print(f"  {r['recipe']:<20} {outcome(r):<12} {speed}" + (f" [{ci[0]:.3f}-{ci[1]:.3f}]" if ci else "")
              + (f", {r['rounds']} rounds" if r.get("rounds") else ""))


def _compare(reports: list[dict[str, Any]]) -> bool:
    """Same accepted set apart from recipes inconclusive in either run; each total inside the others' intervals."""
    ok = True
    for i, a in enumerate(reports):
        for j, b in enumerate(reports):
            if j <= i:
                continue
            unsure = {r["recipe"] for rep in (a, b) for r in rep["recipes"] if outcome(r) == "inconclusive"}
            same = set(a["accepted"]) - unsure == set(b["accepted"]) - unsure
            print(f"\nruns {i + 1} and {j + 1}: accepted sets {'agree' if same else 'DIFFER'} "
                  f"(inconclusive in either: {sorted(unsure) or 'none'})")
            ok &= same
            for x, y, nx, ny in ((a, b, i + 1, j + 1), (b, a, j + 1, i + 1)):
                ci = y.get("speedup_ci")
                if x.get("speedup") is None or not ci:
                    print(f"  run {nx}'s total against run {ny}'s interval: not measured")
                    continue
                inside = ci[0] <= x["speedup"] <= ci[1]
                print(f"  run {nx}'s total {x['speedup']:.3f}x is {'inside' if inside else 'OUTSIDE'} run {ny}'s "
                      f"interval [{ci[0]:.3f}-{ci[1]:.3f}]")
                ok &= inside
    return ok


def _baseline_tree(ref: str, where: Path) -> Path:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), ref], check=True,
                   capture_output=True)
    return where / "src"


def repeat(args: argparse.Namespace, workload: list[str]) -> int:
    extra = list(args.optimize_args or [])
    with tempfile.TemporaryDirectory(prefix="bench-confidence-") as tmp:
        runs = Path(tmp) / "runs"
        old: tuple[dict[str, Any], float] | None = None
        if args.baseline_ref:
            tree = Path(tmp) / "baseline"
            try:
                old = _optimize(_baseline_tree(args.baseline_ref, tree), workload, args.baseline_args or [], runs)
            finally:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                               capture_output=True)
            _describe(f"baseline {args.baseline_ref} (fixed rounds, median)", *old)
        reports = []
        for i in range(args.repeat):
            report, wall = _optimize(ROOT / "src", workload, extra, runs)
            _describe(f"run {i + 1} (sequential test)", report, wall)
            reports.append((report, wall))
    ok = _compare([r for r, _ in reports])
    if old is not None:
        for i, (report, wall) in enumerate(reports):
            unsure = {r["recipe"] for r in report["recipes"] if outcome(r) == "inconclusive"}
            print(f"\nrun {i + 1} vs baseline: wall {wall / old[1]:.2f}x of the baseline's "
                  f"({wall / 60:.1f} vs {old[1] / 60:.1f} min; target <= 0.45); accepted "
                  f"{sorted(report['accepted'])} vs {sorted(old[0]['accepted'])} (inconclusive now: "
                  f"{sorted(unsure) or 'none'})")
    return 0 if ok else 1


class Stalled:
    """A loss function that waits ``stall_ms`` a call first: exactly (``sd`` 0), or a seeded
    lognormal amount of the same mean whose log scatters ``sd``."""

    def __init__(self, loss_fn: Any, stall_ms: float, sd: float, seed: int) -> None:
        self.loss_fn, self.stall_ms, self.sd, self.rng = loss_fn, stall_ms, sd, random.Random(seed)

    def __call__(self, outputs: Any, targets: Any) -> Any:
        time.sleep(self.stall_ms / 1000.0 * math.exp(self.rng.gauss(-self.sd * self.sd / 2.0, self.sd)))
        return self.loss_fn(outputs, targets)


def a_vs_a(args: argparse.Namespace) -> int:
    from profilednn.optimization import Settings
    from profilednn.optimization.engine import optimize_setup
    from profilednn.optimization.recipe_contract import Recipe
    from profilednn.workloads import build_workload

    class Nothing(Recipe):
        name = "a_vs_a"
        family = "test"

        def __init__(self, search: int) -> None:
            self.search = search  # seeds B's stalls: the same sequence per search in every tree

        def check(self, setup: Any, ctx: Any) -> str | None:
            return None

        def apply(self, setup: Any, ctx: Any) -> str:
            if args.noisier_b:
                setup.loss_fn = Stalled(setup.loss_fn.loss_fn, args.stall_ms, args.noisier_b, seed=1000 + self.search)
                return f"changes nothing; waits {args.stall_ms:g} ms a step on average, scattering {args.noisier_b:.0%}"
            return "changes nothing"

    sizes = {k: v for k, v in (("batch_size", args.batch_size), ("image_size", args.image_size)) if v}
    accepted = 0
    for i in range(args.a_vs_a):
        setup = build_workload(args.model, **sizes)
        if args.noisier_b:
            setup.loss_fn = Stalled(setup.loss_fn, args.stall_ms, 0.0, seed=i)
        settings = Settings(headroom=False, measure_flops=False, final_ab=False, time_budget_s=0)
        report = optimize_setup(setup, [Nothing(i)], settings).report
        r = report.recipes[0]
        accepted += r.accepted
        ci = r.speedup_ci
        print(f"run {i + 1}: {r.outcome} {r.speedup:.3f}x" + (f" [{ci[0]:.3f}-{ci[1]:.3f}]" if ci else "")
              + f" after {r.rounds} rounds" + ("; widened: B scatters more" if "scatter" in r.decision else "")
              + f"; {noise_line(report.a_vs_a)}")
    print(f"\nthe recipe that changes nothing was accepted in {accepted} of {args.a_vs_a} runs (target: 0)")
    return 0 if accepted == 0 else 1


def main(argv: list[str]) -> int:
    workload: list[str] = []
    if "--" in argv:
        workload = argv[argv.index("--"):]
        argv = argv[:argv.index("--")]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=0, help="optimize runs back to back")
    ap.add_argument("--baseline-ref", default=None, help="an older commit whose CLI runs once first (fixed rounds)")
    ap.add_argument("--a-vs-a", type=int, default=0, help="searches with one recipe that changes nothing")
    ap.add_argument("--noisier-b", type=float, default=0.0,
                    help="with --a-vs-a: the recipe's arm waits as long on average, scattering this much (0.4: 40%%)")
    ap.add_argument("--stall-ms", type=float, default=20.0, help="with --noisier-b: the mean wait a step, ms")
    ap.add_argument("--model", default=None)
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--image-size", type=int, default=None)
    ap.add_argument("--optimize-args", nargs="*", help="more options for the new runs (e.g. --time-budget 600)")
    ap.add_argument("--baseline-args", nargs="*", help="more options for the baseline run")
    args = ap.parse_args(argv)
    if args.noisier_b < 0 or args.stall_ms <= 0:
        ap.error("--noisier-b must be >= 0 (0.4: 40%) and --stall-ms > 0")
    if args.noisier_b and not args.a_vs_a:
        ap.error("--noisier-b goes with --a-vs-a N")
    if args.a_vs_a:
        if not args.model:
            ap.error("--a-vs-a needs --model")
        return a_vs_a(args)
    if not args.repeat:
        ap.error("give --repeat N or --a-vs-a N")
    if args.model:
        workload = ["--model", args.model] + [x for k, v in (("--batch-size", args.batch_size),
                                                             ("--image-size", args.image_size)) if v
                                              for x in (k, str(v))] + workload
    if not workload:
        ap.error("give --model NAME or a script after --")
    return repeat(args, workload)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""``optimize --nproc-per-node 2 -- python train.py`` against the same script optimized in one
process at the same global batch (issue 45): the recipes each accepts, the totals with their
intervals, and whether the ranks stayed in sync (every arm compares the ranks' parameters).

    .venv/bin/python benchmarks/bench_optimize_ddp.py                 # scripts/ddp_convnet_train.py
    .venv/bin/python benchmarks/bench_optimize_ddp.py --time-budget 300 --global-batch 32
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from profilednn.distributed.script_arms import optimize_ddp_script
from profilednn.optimization.script.job import optimize_script
from profilednn.optimization.settings import Settings
from profilednn.topology import cpu_topology

SCRIPT = Path(__file__).resolve().parent / "scripts" / "ddp_convnet_train.py"


def _summary(label: str, report, wall: float) -> set[str]:  # noqa: ANN001
    accepted = set(report.accepted)
    ci = report.speedup_ci
    total = f"{report.speedup:.3f}x" if report.speedup else "not timed"
    interval = f" [{ci[0]:.3f}-{ci[1]:.3f}]" if ci else ""
    print(f"\n{label}: {wall / 60:.1f} min; accepted {sorted(accepted) or 'nothing'}; total {total}{interval}")
    for row in report.recipes:
        if row.applies:
            interval = f" [{row.speedup_ci[0]:.3f}-{row.speedup_ci[1]:.3f}]" if row.speedup_ci else ""
            speed = f"{row.speedup:.3f}x" if row.speedup else "-"
            print(f"  {row.recipe:20s} {speed}{interval} {row.outcome} ({row.numerics})")
        else:
            print(f"  {row.recipe:20s} skipped: {row.reason[:100]}")
    return accepted


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--global-batch", type=int, default=32)
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--time-budget", type=float, default=900.0)
    ap.add_argument("--runs-dir", default=None)
    args = ap.parse_args()
    runs = args.runs_dir or tempfile.mkdtemp(prefix="bench-optimize-ddp-")
    base = ["python", str(SCRIPT), "--image-size", str(args.image_size), "--epochs", "50"]
    print(f"{SCRIPT.name}, global batch {args.global_batch}, {args.image_size}px; Runs in {runs}; "
          f"CPU: {cpu_topology().model_name}, {cpu_topology().physical_cores} cores", flush=True)
    say = lambda message: print(f"  {message}", flush=True)  # noqa: E731
    t0 = time.monotonic()
    _, ddp = optimize_ddp_script([*base, "--batch-size", str(args.global_batch // args.ranks)], runs,
                                 settings=Settings.for_script(nproc_per_node=args.ranks,
                                                              time_budget_s=args.time_budget), progress=say)
    ddp_wall = time.monotonic() - t0
    t0 = time.monotonic()
    _, one = optimize_script([*base, "--batch-size", str(args.global_batch)], runs,
                             settings=Settings.for_script(time_budget_s=args.time_budget), progress=say)
    one_wall = time.monotonic() - t0
    a = _summary(f"{args.ranks} ranks x {args.global_batch // args.ranks} a rank", ddp, ddp_wall)
    b = _summary(f"1 process x {args.global_batch}", one, one_wall)
    print(f"\nsame accepted in-process recipes: {sorted(a & b)}; only under DDP: {sorted(a - b)}; "
          f"only in one process: {sorted(b - a)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

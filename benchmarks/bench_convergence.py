"""Convergence vs global batch (seed 000, Fig 7) on scikit-learn's digits.

Epochs to the target test accuracy at each global batch, median over seeds, for each
learning-rate scaling rule; the ratio column is Fig 7's normalized convergence.

    .venv/bin/python benchmarks/bench_convergence.py
    .venv/bin/python benchmarks/bench_convergence.py --target 0.97 --seeds 0,1,2,3,4
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

from profilednn.distributed.convergence import LR_SCALING, convergence_study


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--global-batches", default="16,32,64,128,256,512")
    ap.add_argument("--target", type=float, default=0.95)
    ap.add_argument("--max-epochs", type=int, default=80)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--scaling", default=",".join(LR_SCALING), help="lr scaling rules to compare")
    args = ap.parse_args()

    batches = [int(b) for b in args.global_batches.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = tempfile.mkdtemp(prefix="bench-convergence-")
    t0 = time.monotonic()
    for rule in args.scaling.split(","):
        result = convergence_study(batches, target=args.target, max_epochs=args.max_epochs, lr=args.lr,
                                   lr_scaling=rule, seeds=seeds, ranks=[8], runs_dir=runs)
        print(f"\nlr scaling {rule!r}: epochs to {args.target:.0%} (median of {len(seeds)} seeds)")
        print(f"{'global':>6} {'lr':>7} {'epochs':>7} {'steps':>6} {'ratio':>6} {'reached':>8} {'best acc':>8}")
        for r in result.table.iter_rows(named=True):
            e = r["epochs_to_target"]
            print(f"{r['global_batch']:6d} {r['lr']:7.3f} {e if e is not None else '-':>7} "
                  f"{r['steps_to_target'] if e is not None else '-':>6} "
                  f"{r['convergence_ratio'] if r['convergence_ratio'] is not None else float('nan'):6.2f} "
                  f"{r['seeds_reached']:>4}/{len(seeds)} {r['best_accuracy']:8.3f}")
        for line in result.advice:
            print(f"  advice: {line}")
    print(f"\ntotal {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

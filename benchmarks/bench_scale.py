"""Distributed scaling on this machine: ranks x threads (Table 3), weak scaling, projection.

Every point is a real `profilednn launch` + `profilednn train` job (gloo over loopback).
The strong sweep is repeated ``--repeats`` times, interleaved, and reported as the median
normalized throughput with its min-max spread; the weak sweep's largest multi-rank job
measures the allreduce (alpha-beta) and is projected to 1..64 nodes.

    .venv/bin/python benchmarks/bench_scale.py                           # small_cnn, 32 px
    .venv/bin/python benchmarks/bench_scale.py --model resnet18 --image-size 64 --global-batch 32
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

from profilednn.distributed.projection import project_nodes
from profilednn.distributed.scale import scale_sweep, weak_scaling
from profilednn.topology import cpu_topology


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="small_cnn")
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--global-batch", type=int, default=32)
    ap.add_argument("--local-batch", type=int, default=16, help="weak scaling: batch per rank")
    ap.add_argument("--cores", type=int, default=cpu_topology().physical_cores)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3, help="strong sweeps, interleaved")
    ap.add_argument("--runs-dir", default=None, help="keep the Runs here (default: a temporary directory)")
    args = ap.parse_args()

    runs = args.runs_dir or tempfile.mkdtemp(prefix="bench-scale-")
    print(f"{args.model} {args.image_size}px, global batch {args.global_batch}, {args.cores} cores, "
          f"{args.steps} steps ({args.warmup} warm-up) per point, {args.repeats} repeats; Runs in {runs}")
    t0 = time.monotonic()
    by_point: dict[tuple[int, int], list[float]] = {}
    ips: dict[tuple[int, int], list[float]] = {}
    for rep in range(args.repeats):
        result = scale_sweep(args.model, args.cores, args.global_batch, steps=args.steps, warmup=args.warmup,
                             runs_dir=runs, image_size=args.image_size)
        for row in result.table.iter_rows(named=True):
            key = (row["ranks"], row["threads"])
            by_point.setdefault(key, []).append(row["normalized"])
            ips.setdefault(key, []).append(row["items_per_s"])
        print(f"  sweep {rep + 1}: " + ", ".join(f"{r}x{t} {v[-1]:.2f}" for (r, t), v in sorted(by_point.items())))
    print(f"\nstrong scaling at global batch {args.global_batch} (normalized to the smallest configuration)")
    print(f"{'ranks':>5} {'threads':>7} {'items/s':>9} {'norm. median':>13} {'min':>6} {'max':>6}")
    for (r, t), v in sorted(by_point.items()):
        print(f"{r:5d} {t:7d} {statistics.median(ips[(r, t)]):9.1f} {statistics.median(v):13.2f} "
              f"{min(v):6.2f} {max(v):6.2f}")

    weak = weak_scaling(args.model, args.cores, args.local_batch, steps=args.steps, warmup=args.warmup,
                        runs_dir=runs, image_size=args.image_size)
    print(f"\nweak scaling, local batch {args.local_batch}")
    print(f"{'ranks':>5} {'global':>6} {'step ms':>8} {'items/s':>9} {'efficiency':>10}")
    for row in weak.table.sort("ranks").iter_rows(named=True):
        print(f"{row['ranks']:5d} {row['global_batch']:6d} {row['step_ms']:8.1f} {row['items_per_s']:9.1f} "
              f"{row['efficiency']:10.0%}")
    multi = weak.table.filter(weak.table["ranks"] > 1)
    if multi.height:
        table, notes, _ = project_nodes(multi.sort("ranks")["rank0_run"][-1], max_nodes=64)
        print("\nprojection (alpha-beta from this machine's loopback allreduce)")
        print(f"{'nodes':>5} {'ranks':>5} {'step ms':>8} {'items/s':>10} {'efficiency':>10}")
        for row in table.iter_rows(named=True):
            print(f"{row['nodes']:5d} {row['ranks']:5d} {row['step_ms']:8.1f} {row['items_per_s']:10.0f} "
                  f"{row['efficiency']:10.0%}")
        for n in notes:
            print(f"  note: {n}")
    print(f"\ntotal {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Capture overhead: step time of a workload plain vs ``--light`` vs full capture.

All three run in one process on the same model, interleaved round by round, so the
ratios are not skewed by drift. Plain steps are timed with ``perf_counter`` around a
plain training step; captured steps are timed by the Run's own step markers.

    .venv/bin/python benchmarks/bench_capture.py                # resnet50, batch 16, 224
    .venv/bin/python benchmarks/bench_capture.py --model small_cnn --batch-size 32 --image-size 32
    .venv/bin/python benchmarks/bench_capture.py --stack compiled    # torch.compile loop
    .venv/bin/python benchmarks/bench_capture.py --stack lightning   # pytorch_lightning.Trainer

The ``--stack`` variants (bench_capture_stacks.py) also time ``torch.profiler`` alone with
the options full capture uses, interleaved: full capture should be no slower than it.

    .venv/bin/python benchmarks/bench_capture.py --script /work/ext/minGPT   # minGPT's chargpt

``--script MINGPT`` (bench_capture_script.py) runs a public script unmodified, each mode a
fresh process: plain, torch.profiler alone, ``profile --light`` and full ``profile
--stop-after``; step time, peak RSS and wall. ``bench_capture_script.py --script imagenet``
(``hf_trainer``, ``all``) does the same on pytorch/examples' ImageNet script and transformers'
``run_mae.py`` (a ``Trainer`` with evaluation steps).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from profilednn.capture import profile_builtin
from profilednn.workloads import build_workload


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    ap.add_argument("--steps", type=int, default=3, help="measured steps per mode per round")
    ap.add_argument("--light-target-pct", type=float, default=None,
                    help="default: 10 for built-in models, 5 for --stack compiled/lightning")
    ap.add_argument("--strict", action="store_true", help="exit 1 when --light misses its target")
    ap.add_argument("--stack", choices=("builtin", "compiled", "lightning"), default="builtin",
                    help="compiled / lightning: a CNN under torch.compile or a Lightning Trainer")
    ap.add_argument("--script", metavar="MINGPT", default=None,
                    help="a minGPT checkout: time its projects/chargpt/chargpt.py (bench_capture_script.py)")
    args = ap.parse_args()
    if args.script is not None:
        import subprocess
        import sys
        from pathlib import Path

        here = Path(__file__).resolve().parent
        return subprocess.call([sys.executable, str(here / "bench_capture_script.py"), args.script,
                                "--rounds", str(args.rounds)])
    if args.stack == "builtin" and args.light_target_pct is None:
        args.light_target_pct = 10.0
    if args.stack != "builtin":
        import os
        import sys

        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from bench_capture_stacks import bench_stack

        target = 5.0 if args.light_target_pct is None else args.light_target_pct
        ok = bench_stack(args.stack, batch=args.batch_size, image=args.image_size, rounds=args.rounds,
                         steps=args.steps, light_target_pct=target)
        return 0 if ok or not args.strict else 1

    torch.manual_seed(0)
    wl = build_workload(args.model, batch_size=args.batch_size, image_size=args.image_size)
    print(f"{args.model} batch {args.batch_size} image {args.image_size}, threads {torch.get_num_threads()}, "
          f"{args.rounds} rounds x {args.steps} steps per mode")
    wl.run()  # warm-up: primitive creation, allocator
    times: dict[str, list[float]] = {"plain": [], "light": [], "full": []}
    with tempfile.TemporaryDirectory() as runs:
        for r in range(args.rounds):
            for _ in range(args.steps):
                t0 = time.perf_counter()
                wl.run()
                times["plain"].append((time.perf_counter() - t0) * 1000)
            for mode in ("light", "full"):
                run = profile_builtin(args.model, runs, steps=args.steps, warmup=1, workload=wl,
                                      light=(mode == "light"))
                times[mode].extend(run.steps["time_ms"].to_list())
            print(f"  round {r + 1}: " + ", ".join(f"{k} {statistics.median(v[-args.steps:]):.1f} ms"
                                                  for k, v in times.items()))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\n{'mode':6} {'median ms':>10} {'min':>9} {'max':>9} {'vs plain':>9}")
    for k, v in times.items():
        print(f"{k:6} {med[k]:10.1f} {min(v):9.1f} {max(v):9.1f} {med[k] / med['plain']:8.3f}x")
    light_pct = (med["light"] / med["plain"] - 1) * 100
    full_pct = (med["full"] / med["plain"] - 1) * 100
    ok = light_pct <= args.light_target_pct
    print(f"\n--light overhead {light_pct:+.1f}% (target <= {args.light_target_pct:.0f}%: "
          f"{'met' if ok else 'MISSED'}); full capture overhead {full_pct:+.1f}%")
    return 0 if ok or not args.strict else 1


if __name__ == "__main__":
    raise SystemExit(main())

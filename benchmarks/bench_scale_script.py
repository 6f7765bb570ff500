"""``profilednn scale -- python train.py``: Table 3 and weak scaling of a user's DDP script (issue 45).

Every layout is a real pinned launch of the unmodified script (gloo over loopback). The
strong sweep (``--batch-arg`` keeps the global batch) is repeated ``--repeats`` times and
reported as the median normalized throughput with its min-max spread; then one weak sweep
(the script's per-rank batch kept). The same study on the built-in trainer's resnet18 at the
same sizes (``--builtin``) puts the two paths side by side.

    .venv/bin/python benchmarks/bench_scale_script.py                       # scripts/ddp_convnet_train.py
    .venv/bin/python benchmarks/bench_scale_script.py --batch-arg=-b -- python train.py ...   # your script
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from profilednn.distributed.script_scale import scale_script, weak_script
from profilednn.topology import cpu_topology

SCRIPT = Path(__file__).resolve().parent / "scripts" / "ddp_convnet_train.py"


def _rows(table) -> dict[tuple[int, int], dict]:  # noqa: ANN001
    return {(r["ranks"], r["threads"]): r for r in table.iter_rows(named=True)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cores", type=int, default=cpu_topology().physical_cores)
    ap.add_argument("--global-batch", type=int, default=32)
    ap.add_argument("--batch-arg", default="--batch-size", help="the script's per-rank batch option")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="strong sweeps, one after another")
    ap.add_argument("--runs-dir", default=None, help="keep the Runs here (default: a temporary directory)")
    ap.add_argument("script", nargs=argparse.REMAINDER, help="-- python train.py ARGS (default: the convnet)")
    args = ap.parse_args()
    argv = [a for a in args.script if a != "--"] or ["python", str(SCRIPT), "--image-size", "64", "--epochs", "50"]

    runs = args.runs_dir or tempfile.mkdtemp(prefix="bench-scale-script-")
    print(f"{' '.join(argv)}\nglobal batch {args.global_batch}, {args.cores} cores, {args.steps} steps "
          f"({args.warmup} warm-up) per layout, {args.repeats} strong sweeps; Runs in {runs}", flush=True)
    t0 = time.monotonic()
    norm: dict[tuple[int, int], list[float]] = {}
    last = None
    for rep in range(args.repeats):
        last = scale_script(argv, args.cores, global_batch=args.global_batch, batch_arg=args.batch_arg,
                            steps=args.steps, warmup=args.warmup, runs_dir=runs)
        for key, row in _rows(last.table).items():
            norm.setdefault(key, []).append(row["normalized"])
        print(f"  sweep {rep + 1}: " + ", ".join(f"{r}x{t} {v[-1]:.2f}" for (r, t), v in sorted(norm.items())),
              flush=True)
    assert last is not None
    print(f"\nstrong scaling at global batch {args.global_batch} (last sweep's figures; normalized: median, "
          "min-max over the sweeps)")
    print(f"{'ranks':>5} {'threads':>7} {'local':>5} {'global':>6} {'step ms':>8} {'compute':>8} {'allred.':>8} "
          f"{'exposed':>8} {'items/s':>8} {'norm.':>6} {'min':>5} {'max':>5}")
    for key, r in sorted(_rows(last.table).items()):
        v = norm[key]
        print(f"{r['ranks']:5d} {r['threads']:7d} {r['local_batch']:5d} {r['global_batch']:6d} {r['step_ms']:8.1f} "
              f"{r['compute_ms']:8.1f} {r['allreduce_ms']:8.1f} {r['exposed_comm_ms']:8.1f} {r['items_per_s']:8.1f} "
              f"{statistics.median(v):6.2f} {min(v):5.2f} {max(v):5.2f}")
    for note in last.notes:
        print(f"note: {note}")

    weak = weak_script(argv, args.cores, steps=args.steps, warmup=args.warmup, runs_dir=runs)
    print("\nweak scaling (the script's per-rank batch kept)")
    for key, r in sorted(_rows(weak.table).items()):
        print(f"  {r['ranks']} rank(s) x {r['threads']}: global batch {r['global_batch']}, step {r['step_ms']:.1f} ms, "
              f"{r['items_per_s']:.1f} items/s, exposed comm {r['exposed_comm_ms']:.1f} ms, "
              f"efficiency {r['efficiency']:.0%}")
    print(f"\nwall {time.monotonic() - t0:.0f} s; CPU: {cpu_topology().model_name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Capture overhead on a public script no one here wrote: minGPT's chargpt, unmodified.

Four modes, each a fresh process, interleaved round by round: ``plain`` (the script alone,
stopped after the same iterations), ``profiler`` (``torch.profiler`` alone over the measured
steps, with full capture's options), ``light`` and ``full`` (``profilednn profile [--light]
--stop-after --steps S --warmup W -- python chargpt_timed.py ...``). The script samples 500
tokens under ``torch.no_grad()`` and saves a checkpoint at iteration 0 (inside the warm-up)
and reads its batches through two forked DataLoader workers. A step is the interval between
two consecutive ``optimizer.step()`` calls inside the measured window (``chargpt_timed.py``);
peak RSS is the main process's (``wait4``); wall is the whole process, start-up included.

    python benchmarks/bench_capture.py --script /work/ext/minGPT            # via bench_capture.py
    python benchmarks/bench_capture_script.py /work/ext/minGPT --rounds 2 --batch-size 16

minGPT is not part of ProfileDNN: give the folder of a checkout of karpathy/minGPT.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
LAUNCHER = HERE / "scripts" / "chargpt_timed.py"
MODES = ("plain", "profiler", "light", "full")


def _command(mode: str, mingpt: str, times: Path, runs: Path, args: argparse.Namespace) -> list[str]:
    w, s = args.warmup, args.steps
    launch = [str(LAUNCHER), "--mingpt", mingpt, "--times", str(times)]
    cfg = [f"--trainer.batch_size={args.batch_size}", f"--trainer.num_workers={args.workers}"]
    if mode == "plain":
        return [sys.executable, *launch, "--", f"--trainer.max_iters={w + s}", *cfg]
    if mode == "profiler":
        return [sys.executable, *launch, "--profiler-window", f"{w}:{w + s}", "--",
                f"--trainer.max_iters={w + s + 1}", *cfg]
    light = ["--light"] if mode == "light" else []
    return [sys.executable, "-m", "profilednn", "profile", *light, "--stop-after", "--steps", str(s),
            "--warmup", str(w), "-o", str(runs), "--", "python", *launch, "--",
            f"--trainer.max_iters={w + s + 1}", *cfg]


def run_once(mode: str, mingpt: str, work: Path, args: argparse.Namespace) -> dict[str, object]:
    """One process of ``mode``: its window's step times (ms), peak RSS (MiB) and wall (s)."""
    times = work / f"{mode}-{time.monotonic_ns()}.json"
    cmd = _command(mode, mingpt, times, work / "runs", args)
    t0 = time.perf_counter()
    with open(work / f"{mode}.log", "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{mode} exited {proc.returncode}; see {work / (mode + '.log')}")
    starts = json.loads(times.read_text())["step_starts_s"]
    w, s = args.warmup, args.steps
    # intervals between step starts that lie wholly inside the window (steps w .. w+s-1)
    steps = [(b - a) * 1000 for a, b in zip(starts[w:w + s - 1], starts[w + 1:w + s])]
    return {"steps": steps, "rss_mib": usage.ru_maxrss / 1024, "wall_s": wall}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mingpt", help="folder holding minGPT's mingpt/ and projects/chargpt/")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--modes", default=",".join(MODES), help="a subset, comma-separated (plain always runs)")
    args = ap.parse_args()
    args.modes = ["plain", *[m for m in MODES[1:] if m in args.modes.split(",")]]
    if not (Path(args.mingpt) / "projects" / "chargpt" / "chargpt.py").is_file():
        raise SystemExit(f"no projects/chargpt/chargpt.py under {args.mingpt}: give a minGPT checkout")
    results: dict[str, list[dict[str, object]]] = {m: [] for m in args.modes}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for mode in args.modes:
                results[mode].append(run_once(mode, args.mingpt, Path(tmp), args))
                last = results[mode][-1]
                print(f"  round {r + 1} {mode:8} steps {[round(t) for t in last['steps']]} ms, "
                      f"RSS {last['rss_mib']:.0f} MiB, wall {last['wall_s']:.1f} s", flush=True)
    report(results, args)
    return 0


def report(results: dict[str, list[dict[str, object]]], args: argparse.Namespace) -> None:
    steps = {m: [t for r in rs for t in r["steps"]] for m, rs in results.items()}  # type: ignore[union-attr]
    med = {m: statistics.median(v) for m, v in steps.items()}
    print(f"\nchargpt (minGPT gpt-mini), batch {args.batch_size}, {args.workers} DataLoader workers, "
          f"--warmup {args.warmup} --steps {args.steps}, {args.rounds} rounds")
    print(f"{'mode':9} {'step ms':>9} {'min':>8} {'max':>8} {'vs plain':>9} {'peak RSS MiB':>13} {'wall s':>8}")
    for m in results:
        rss = max(r["rss_mib"] for r in results[m])  # type: ignore[type-var]
        wall = statistics.median(r["wall_s"] for r in results[m])  # type: ignore[misc]
        print(f"{m:9} {med[m]:9.1f} {min(steps[m]):8.1f} {max(steps[m]):8.1f} "
              f"{med[m] / med['plain']:8.3f}x {rss:13.0f} {wall:8.1f}")
    pct = {m: (med[m] / med["plain"] - 1) * 100 for m in results}
    if len(pct) < len(MODES):
        return
    print(f"\nlight {pct['light']:+.1f}% (target <= 3%); full {pct['full']:+.1f}% vs torch.profiler "
          f"alone {pct['profiler']:+.1f}% (target: full <= profiler + 5 points)")


if __name__ == "__main__":
    raise SystemExit(main())

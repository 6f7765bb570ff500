"""What does one optimize arm cost beyond the script's own steps?

Every arm of ``profilednn optimize -- python train.py`` is a fresh process
(``python -m profilednn.optimization.script``) that imports ProfileDNN, runs the script for
``--warmup`` + ``--steps`` steps and reports back; a search runs dozens. This times, in
interleaved rounds (order alternating): ``python -c "import torch"`` (the floor every process
that trains with torch pays), the stock arm of the script with this tree's ProfileDNN and,
with ``--baseline-src``, with another tree's (a worktree of an older commit). Per arm: its
wall from start to exit (paired against the baseline's in the same round) and the median of
its timed steps (after its warm-up), which the trees must not change; and, in a process of its
own, the seconds the arm's module takes to import after torch and ``torch._dynamo`` (which
every training script loads: its first optimizer does), the start-up a tree adds. The warm-up steps are
not split off: the first one holds what the script does before it (its imports, its set-up),
and which of those a tree has loaded already moves time between the start and that step.

    git worktree add --detach /tmp/old 3826154
    .venv/bin/python benchmarks/bench_arm_start.py --baseline-src /tmp/old/src --rounds 8 \\
        -- python benchmarks/scripts/gpt_train.py --steps 30

Run it with nothing else on the machine: wall times are what it compares.
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

ROOT = Path(__file__).resolve().parents[1]


def _env(src: Path | None) -> dict[str, str]:
    """This process's environment with ``src`` first on ``PYTHONPATH`` (unchanged for None)."""
    if src is None:
        return dict(os.environ)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), *filter(None, [os.environ.get("PYTHONPATH")])])}


def _wall(argv: list[str], src: Path | None) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, env=_env(src), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[-600:]}")
    return wall


def _arm(src: Path, spec: dict, tmp: Path) -> tuple[float, float]:
    """One stock arm under ``src``: its wall seconds and the median of its timed steps (ms)."""
    spec_path, result_path = tmp / "spec.json", tmp / "result.json"
    spec_path.write_text(json.dumps(spec))
    result_path.unlink(missing_ok=True)
    wall = _wall([sys.executable, "-m", "profilednn.optimization.script", str(spec_path), str(result_path)], src)
    result = json.loads(result_path.read_text())
    if result.get("status") != "window":
        raise SystemExit(f"the arm under {src} did not measure its window: {result.get('error') or result}")
    return wall, statistics.median(result["times_ms"])


_IMPORT_PROBE = ("import time, torch, torch._dynamo\n"
                 "started = time.perf_counter()\n"
                 "import profilednn.optimization.script.arm\n"
                 "print(time.perf_counter() - started)\n")


def _arm_import(src: Path) -> float:
    """Seconds to import the arm's module under ``src``, torch and ``torch._dynamo`` loaded first."""
    done = subprocess.run([sys.executable, "-c", _IMPORT_PROBE], env=_env(src), capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def _describe(label: str, values: list[float], unit: str = "s") -> str:
    return f"{label:<36} {statistics.median(values):8.2f} {unit}  ({min(values):.2f}-{max(values):.2f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2, help="the arm's untimed steps (optimize's script default)")
    parser.add_argument("--steps", type=int, default=5, help="the arm's timed steps (optimize's script default)")
    parser.add_argument("--baseline-src", type=Path, help="another tree's src/ to time the same arm with")
    parser.add_argument("script", nargs=argparse.REMAINDER, help="-- python train.py ARGS")
    args = parser.parse_args(argv)
    script = args.script[1:] if args.script[:1] == ["--"] else args.script
    if not script:
        parser.error("give the script after --: -- python train.py ARGS")
    if args.baseline_src is not None and not (args.baseline_src / "profilednn").is_dir():
        parser.error(f"--baseline-src {args.baseline_src} holds no profilednn package")
    spec = {"argv": script, "warmup": args.warmup, "steps": args.steps, "seed": 0, "window": True, "recipes": []}
    trees = {"this tree": ROOT / "src", **({"baseline": args.baseline_src} if args.baseline_src else {})}
    torch_only: list[float] = []
    walls: dict[str, list[float]] = {k: [] for k in trees}
    step: dict[str, list[float]] = {k: [] for k in trees}
    imports: dict[str, list[float]] = {k: [] for k in trees}
    with tempfile.TemporaryDirectory(prefix="bench-arm-start-") as tmp:
        for r in range(args.rounds):
            order = list(trees) if r % 2 == 0 else list(reversed(trees))
            torch_only.append(_wall([sys.executable, "-c", "import torch"], None))
            for label in order:
                wall, step_ms = _arm(trees[label], spec, Path(tmp))
                walls[label].append(wall)
                step[label].append(step_ms)
                imports[label].append(_arm_import(trees[label]))
            print(f"round {r + 1}/{args.rounds}: import torch {torch_only[-1]:.2f} s, "
                  + ", ".join(f"{k} arm {walls[k][-1]:.2f} s (step {step[k][-1]:.1f} ms)" for k in trees), flush=True)
    print(f"\n{' '.join(script)}: window {args.warmup} + {args.steps} steps, {args.rounds} rounds, "
          "median (min-max)")
    print(_describe('python -c "import torch"', torch_only))
    for label in trees:
        print(_describe(f"{label}: arm wall", walls[label]))
        print(_describe(f"{label}: timed step (median)", step[label], "ms"))
        print(_describe(f"{label}: arm import after torch", imports[label]))
    if args.baseline_src:
        saved = [b - a for a, b in zip(walls["this tree"], walls["baseline"])]
        print(_describe("baseline - this tree, wall (paired)", saved))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Stress: N consecutive 2-rank `profilednn launch` jobs of a correct gloo DDP script must all succeed.

Each launch runs a small DDP model for a few steps, checks the replicas agree, calls
``destroy_process_group()`` and exits normally, so every launch crosses the rank-exit
path where a racy teardown would show as a SIGABRT ("terminate called without an
active exception"). The launcher never retries: one failure is a failed launch.

    python benchmarks/bench_launch_stress.py [--launches 30] [--torchrun]

``--torchrun`` runs the same script under plain ``torchrun --nproc-per-node 2`` for
comparison. Prints each launch's exit code and wall time, and a JSON summary at the end
(ok count, failures with their last stderr lines, median and spread of the wall time).

To catch a rare abort's cause, every launch runs with ``PYTHONFAULTHANDLER=1`` (an
aborting rank writes every thread's Python stack into its stderr log) and core dumps
allowed (``RLIMIT_CORE`` raised to its hard limit; where the core lands is the kernel's
``core_pattern``); the rank logs of a failed launch are copied to ``--failures-dir``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DDP_SCRIPT = '''
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(8, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad(); model(torch.randn(16, 8)).sum().backward(); opt.step()
weights = model.module.weight.detach().clone()
gathered = [torch.zeros_like(weights) for _ in range(world)]
dist.all_gather(gathered, weights)
print(f"rank {rank}/{world} in_sync {all(torch.equal(gathered[0], w) for w in gathered)}")
dist.destroy_process_group()
'''


def one_launch(script: Path, work: Path, torchrun: bool, timeout: float) -> tuple[int, float, str]:
    if torchrun:
        argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(script)]
    else:
        argv = [sys.executable, "-m", "profilednn", "launch", "--nproc-per-node", "2", "--threads-per-rank", "1",
                "--timeout", str(timeout), "-o", str(work / "runs"), "--", "python", str(script)]
    t0 = time.monotonic()
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 60, cwd=work, check=False,
                         env=env)
    wall = time.monotonic() - t0
    synced = res.stdout.count("in_sync True") == 2
    code = res.returncode if res.returncode or synced else 99  # 99: exited 0 without both results
    return code, wall, res.stderr[-1500:] + res.stdout[-500:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=30)
    ap.add_argument("--torchrun", action="store_true", help="plain torchrun instead of profilednn launch")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--failures-dir", type=Path, default=Path("stress-failures"),
                    help="where the rank logs of a failed launch are copied (default ./stress-failures)")
    args = ap.parse_args(argv)
    _, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))
    with tempfile.TemporaryDirectory(prefix="profilednn-stress-") as tmp:
        work = Path(tmp)
        script = work / "ddp.py"
        script.write_text(DDP_SCRIPT, encoding="utf-8")
        walls, failures = [], []
        for i in range(args.launches):
            code, wall, tail = one_launch(script, work, args.torchrun, args.timeout)
            walls.append(wall)
            print(f"launch {i + 1}/{args.launches}: exit {code}, {wall:.1f} s", flush=True)
            runs = work / "runs"
            if code:
                failures.append({"launch": i + 1, "exit": code, "tail": tail})
                if runs.is_dir():
                    dest = args.failures_dir / f"launch{i + 1}"
                    shutil.copytree(runs, dest, dirs_exist_ok=True)
                    print(f"  rank logs kept in {dest}", flush=True)
            shutil.rmtree(runs, ignore_errors=True)  # each launch's job directory alone
    summary = {"launcher": "torchrun" if args.torchrun else "profilednn launch", "launches": args.launches,
               "ok": args.launches - len(failures), "failures": failures,
               "wall_s_median": round(statistics.median(walls), 2),
               "wall_s_min": round(min(walls), 2), "wall_s_max": round(max(walls), 2)}
    print(json.dumps(summary, indent=2))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())

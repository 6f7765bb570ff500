"""Stress: the same 2-rank gloo DDP script under `profilednn launch` and under `torchrun --standalone`, interleaved.

Each round launches the script once under each launcher (which goes first alternates):

- ``profilednn launch --nproc-per-node 2 --threads-per-rank 1 -- python ddp.py``
- ``torchrun --standalone --nproc-per-node 2 ddp.py`` with ``OMP_NUM_THREADS=1``

The script trains a small DDP model for 3 steps, checks the replicas agree, calls
``destroy_process_group()`` and returns, so every launch crosses the rank-exit path where
PyTorch's teardown can abort a rank that finished its work ("terminate called without an
active exception", SIGABRT; docs/distributed.md). A launch is clean when it exits 0 with
both ranks' results; nothing is retried.

    python benchmarks/bench_launch_stress.py [--rounds 30] [--timeout 300] [--failures-dir DIR]

Prints a progress line per round, then each launcher's clean count and the abort
signatures seen in failed launches, and a JSON summary. Every launch runs with
``PYTHONFAULTHANDLER=1`` and core dumps allowed (``RLIMIT_CORE`` raised to its hard limit;
where a core lands is the kernel's ``core_pattern``); a failed launch's output (and, under
``profilednn launch``, its rank logs) is kept in ``--failures-dir``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
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
LAUNCHERS = ("profilednn launch", "torchrun --standalone")
# What a failed launch's output can show; each failed launch counts every one it shows.
SIGNATURES = {
    "terminate called without an active exception": re.compile(r"terminate called without an active exception"),
    "SIGABRT": re.compile(r"SIGABRT|Signal 6 \(|exitcode\s*:\s*-6\b"),
    "SIGSEGV": re.compile(r"SIGSEGV|Signal 11 \(|exitcode\s*:\s*-11\b"),
    "Fatal Python error": re.compile(r"Fatal Python error"),
    "timeout": re.compile(r"did not finish within|bench timeout"),
}


@dataclass
class Launch:
    """One launch: its exit code, wall time, whether both ranks reported, and its output."""

    code: int
    wall_s: float
    synced: bool
    output: str

    @property
    def clean(self) -> bool:
        return self.code == 0 and self.synced

    def signatures(self) -> list[str]:
        return [name for name, pattern in SIGNATURES.items() if pattern.search(self.output)]


@dataclass
class Tally:
    """One launcher's launches: clean count, failures with their signatures, wall times."""

    launcher: str
    walls: list[float] = field(default_factory=list)
    failures: list[dict] = field(default_factory=list)

    def add(self, round_no: int, launch: Launch) -> None:
        self.walls.append(launch.wall_s)
        if not launch.clean:
            self.failures.append({"round": round_no, "exit": launch.code, "both_results": launch.synced,
                                  "signatures": launch.signatures(), "tail": launch.output[-1500:]})

    def signature_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for failure in self.failures:
            for name in failure["signatures"] or ["(none recognised)"]:
                counts[name] = counts.get(name, 0) + 1
        return counts

    def summary(self) -> dict:
        n = len(self.walls)
        return {"launcher": self.launcher, "launches": n, "clean": n - len(self.failures),
                "signatures": self.signature_counts(), "failures": self.failures,
                "wall_s_median": round(statistics.median(self.walls), 2) if n else None,
                "wall_s_min": round(min(self.walls), 2) if n else None,
                "wall_s_max": round(max(self.walls), 2) if n else None}


def launcher_argv(launcher: str, script: Path, work: Path, timeout: float) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of one launch of ``script`` under ``launcher``."""
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    if launcher == "torchrun --standalone":
        env["OMP_NUM_THREADS"] = "1"
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                str(script)], env
    return [sys.executable, "-m", "profilednn", "launch", "--nproc-per-node", "2", "--threads-per-rank", "1",
            "--timeout", str(timeout), "-o", str(work / "runs"), "--", "python", str(script)], env


def one_launch(launcher: str, script: Path, work: Path, timeout: float) -> Launch:
    argv, env = launcher_argv(launcher, script, work, timeout)
    t0 = time.monotonic()
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 60, cwd=work, check=False,
                             env=env)
        code, out, err = res.returncode, res.stdout, res.stderr
    except subprocess.TimeoutExpired as exc:
        code, out, err = 124, _text(exc.stdout), _text(exc.stderr) + "\nbench timeout"
    return Launch(code, time.monotonic() - t0, out.count("in_sync True") == 2, err + out)


def _text(data: bytes | str | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def keep_failure(launch: Launch, launcher: str, round_no: int, work: Path, failures_dir: Path) -> Path:
    """Copy a failed launch's output and rank logs to ``failures_dir``; returns where."""
    dest = failures_dir / f"round{round_no}-{launcher.split()[0]}"
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "output.txt").write_text(launch.output, encoding="utf-8")
    if (work / "runs").is_dir():
        shutil.copytree(work / "runs", dest / "runs", dirs_exist_ok=True)
    return dest


def progress_line(round_no: int, rounds: int, results: dict[str, Launch]) -> str:
    parts = [f"{name}: {'clean' if r.clean else 'FAILED exit ' + str(r.code)} {r.wall_s:.1f} s"
             + (f" ({', '.join(r.signatures())})" if not r.clean and r.signatures() else "")
             for name, r in results.items()]
    return f"round {round_no}/{rounds}: " + " | ".join(parts)


def report(tallies: dict[str, Tally]) -> str:
    """The clean counts and abort signatures, one block per launcher."""
    lines = []
    for tally in tallies.values():
        s = tally.summary()
        lines.append(f"{tally.launcher}: {s['clean']}/{s['launches']} clean launches "
                     f"(wall median {s['wall_s_median']} s, {s['wall_s_min']}-{s['wall_s_max']} s)")
        for name, count in s["signatures"].items():
            lines.append(f"  {count} x {name}")
    return "\n".join(lines)


def run_rounds(rounds: int, timeout: float, failures_dir: Path) -> dict[str, Tally]:
    tallies = {name: Tally(name) for name in LAUNCHERS}
    with tempfile.TemporaryDirectory(prefix="profilednn-stress-") as tmp:
        work = Path(tmp)
        script = work / "ddp.py"
        script.write_text(DDP_SCRIPT, encoding="utf-8")
        for round_no in range(1, rounds + 1):
            order = LAUNCHERS if round_no % 2 else LAUNCHERS[::-1]  # neither always goes first
            results = {}
            for launcher in order:
                launch = one_launch(launcher, script, work, timeout)
                tallies[launcher].add(round_no, launch)
                if not launch.clean:
                    keep_failure(launch, launcher, round_no, work, failures_dir)
                shutil.rmtree(work / "runs", ignore_errors=True)  # each launch's job directory alone
                results[launcher] = launch
            print(progress_line(round_no, rounds, results), flush=True)
    return tallies


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30, help="rounds; each launches once under each launcher")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds one launch may take")
    ap.add_argument("--failures-dir", type=Path, default=Path("stress-failures"),
                    help="where a failed launch's output and rank logs are kept (default ./stress-failures)")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    _, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))
    tallies = run_rounds(args.rounds, args.timeout, args.failures_dir)
    print(report(tallies))
    print(json.dumps({"rounds": args.rounds, "launchers": [t.summary() for t in tallies.values()]}, indent=2))
    return 0 if not tallies[LAUNCHERS[0]].failures else 1


if __name__ == "__main__":
    sys.exit(main())

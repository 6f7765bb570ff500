"""Measure on whatever machine this runs and say, target by target, what holds here.

Writes ``verify.json`` (every row, the machine, the plan) and a short ``verify.md`` into
``--out`` (default: ``$OUT`` when set, as on the device machine, else ``verify-out/``), plus
``verify.log`` with every check's own output. Each row: the target, the figure, and
``met`` / ``missed`` / ``n/a`` (with the reason: "no CUDA", "2 cores") / ``skipped`` (for
time) / ``error``. The checks run in order against ``--budget-s`` (default 480); what no
longer fits is skipped and listed.

    .venv/bin/python benchmarks/verify.py                      # everything this machine can answer
    .venv/bin/python benchmarks/verify.py --quick --budget-s 120   # small shapes: does it all run?
    .venv/bin/python benchmarks/verify.py --only peaks,kernels
    .venv/bin/python benchmarks/verify.py --host host.json --dry-run   # what a 16-core GPU host would run
    make verify

Parts: any CPU (peaks, optimize of a small convnet and transformer per BF16 tier, the step
model, kernels vs peers); 8+ cores (ranks x threads, weak scaling, 2 -> all cores
projection); CUDA (footprint, offload vs save_on_cpu, CPU/GPU pipeline). Exit status 1
when a row is missed or failed, 2 for bad input.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from profilednn.atomic import atomic_write_text
from profilednn.errors import ProfileDNNError
from verifykit.catalogue import BY_NAME, CHECKS
from verifykit.host import Host, detect_host, load_host
from verifykit.rows import counts, verify_json, verify_md
from verifykit.runner import Outcome, child_main, run_checks


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget-s", type=float, default=480.0, help="wall seconds for all checks (default 480)")
    ap.add_argument("--out", default=None, help="folder for verify.json/.md/.log (default: $OUT, else verify-out)")
    ap.add_argument("--only", default=None, help=f"comma-separated checks: {', '.join(BY_NAME)}")
    ap.add_argument("--quick", action="store_true", help="small shapes: checks that everything runs, not figures")
    ap.add_argument("--host", default=None, help="JSON file overriding the detected host (cores, tier, cuda, ...)")
    ap.add_argument("--dry-run", action="store_true", help="write the plan (n/a and planned rows) without measuring")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.budget_s <= 0:
        ap.error(f"--budget-s must be > 0, not {args.budget_s}")
    if args.only:
        unknown = [n for n in args.only.split(",") if n not in BY_NAME]
        if unknown:
            ap.error(f"unknown check(s) {', '.join(unknown)}; choose from {', '.join(BY_NAME)}")
    return args


def plan_only(host: Host, checks: list) -> Outcome:
    out = Outcome()
    for c in checks:
        reason = c.needs(host)
        out.rows += c.unmeasured("n/a", reason) if reason else c.unmeasured("skipped", "dry run: planned, not run")
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        host = detect_host()
        if args.host:
            host = load_host(args.host, host)
    except ProfileDNNError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.child:
        return child_main(args.child, Path(args.result), host, args.quick)
    out_dir = Path(args.out or os.environ.get("OUT") or "verify-out")
    checks = [BY_NAME[n] for n in args.only.split(",")] if args.only else list(CHECKS)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t0 = time.monotonic()
    print(f"verify on {host.name}: {len(checks)} checks, budget {args.budget_s:.0f} s -> {out_dir}", flush=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.dry_run:
        outcome = plan_only(host, checks)
    else:
        with tempfile.TemporaryDirectory(prefix="verify-") as work, open(out_dir / "verify.log", "w") as log:
            outcome = run_checks(host, checks, args.budget_s, args.quick, Path(work), log, args.host,
                                 progress=lambda m: print(f"[{time.monotonic() - t0:5.0f} s] {m}", flush=True))
    meta = {"started": started, "elapsed_s": round(time.monotonic() - t0, 1), "budget_s": args.budget_s,
            "quick": args.quick, "dry_run": args.dry_run, "skipped_for_time": outcome.skipped_for_time,
            "seconds": outcome.seconds}
    atomic_write_text(out_dir / "verify.json", verify_json(outcome.rows, host.to_dict(), meta))
    md = verify_md(outcome.rows, host.to_dict(), meta)
    atomic_write_text(out_dir / "verify.md", md)
    print(md)
    c = counts(outcome.rows)
    return 1 if c["missed"] or c["error"] else 0


if __name__ == "__main__":
    sys.exit(main())

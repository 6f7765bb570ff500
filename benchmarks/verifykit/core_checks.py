"""The rows that need 8 cores or more: seed 000's ranks x threads layouts (Table 3), seed
001's weak scaling, and the step model's projection from a 2-thread Run to all cores."""

from __future__ import annotations

import tempfile

from .host import Host
from .rows import Row

PART = "8+ cores"
WEAK_EFFICIENCY = 0.70  # throughput per rank at the most ranks, over one rank's
ALL_CORES_PCT = 15.0
# the workload of the distributed rows (a real launch per layout, gloo over loopback)
SCALE = ("small_cnn", {"image_size": 32}, 64)  # model, knobs, global batch


def ranks_threads(host: Host, quick: bool) -> list[Row]:
    """Table 3 at ``host.cores``: 1 x N, 2 x N/2, 4 x N/4, each a pinned launch."""
    from profilednn.distributed.scale import scale_sweep

    model, knobs, global_batch = SCALE
    n = host.cores
    ranks = [r for r in (1, 2, 4) if n % r == 0]
    with tempfile.TemporaryDirectory(prefix="verify-scale-") as runs:
        res = scale_sweep(model, n, global_batch, ranks=ranks, threads=[n // r for r in ranks],
                          steps=4 if quick else 10, warmup=2, runs_dir=runs, **knobs)
    table = {(r["ranks"], r["threads"]): r for r in res.table.iter_rows(named=True)}
    layout = ", ".join(f"{r}x{t} {row['items_per_s']:.0f}/s ({row['normalized']:.2f})"
                       for (r, t), row in sorted(table.items()))
    want = [(r, n // r) for r in ranks]
    ran = all(k in table for k in want)
    one = table.get((1, n))
    best = max(table.values(), key=lambda row: row["items_per_s"]) if table else None
    rows = [Row.judged(PART, "ranks_threads", f"Table 3 at {n} cores: layouts {', '.join(f'{r}x{t}' for r, t in want)} "
                       f"all run (global batch {global_batch})", ran, layout, reason=f"{model} {knobs}",
                       table=[{"ranks": r, "threads": t, **{k: row[k] for k in ("items_per_s", "normalized")}}
                              for (r, t), row in sorted(table.items())])]
    gain = best["items_per_s"] / one["items_per_s"] if best and one and one["items_per_s"] else None
    rows.append(Row.judged(PART, "ranks_threads", f"more ranks with fewer threads beat 1x{n} (seed 000, Table 3)",
                           gain is not None and best is not one and gain > 1.0,
                           f"best {best['ranks']}x{best['threads']}: {gain:.2f}x 1x{n}" if gain else "no 1xN point",
                           gain))
    return rows


def weak_scaling(host: Host, quick: bool) -> list[Row]:
    """Seed 001: a fixed batch per rank, 1..N/2 ranks of 2 threads (or 1 when N < 8)."""
    from profilednn.distributed.scale import weak_scaling as weak

    model, knobs, _ = SCALE
    per_rank = max(1, host.cores // 8)
    with tempfile.TemporaryDirectory(prefix="verify-weak-") as runs:
        res = weak(model, host.cores, 16, threads_per_rank=per_rank, steps=4 if quick else 10, warmup=2,
                   runs_dir=runs, **knobs)
    rows = sorted(res.table.iter_rows(named=True), key=lambda r: r["ranks"])
    last = rows[-1]
    eff = last["efficiency"]
    return [Row.judged(PART, "weak_scaling", f"weak-scaling efficiency at {last['ranks']} ranks >= "
                       f"{WEAK_EFFICIENCY:.0%} (seed 001)", eff is not None and eff >= WEAK_EFFICIENCY,
                       ", ".join(f"{r['ranks']} ranks {r['items_per_s']:.0f}/s ({r['efficiency']:.0%})" for r in rows),
                       eff, reason=f"{model}, batch 16 per rank, {per_rank} thread(s) per rank")]


def projection_all_cores(host: Host, quick: bool) -> list[Row]:
    """Profile at 2 threads, project to all cores, profile at all cores."""
    from profilednn.capture.runners import profile_builtin
    from profilednn.projection.validate import validate

    from .cpu_checks import PROJECTION, STEPS, step_model_rows

    name, knobs, quick_knobs = PROJECTION
    knobs = quick_knobs if quick else knobs
    with tempfile.TemporaryDirectory(prefix="verify-allcores-") as runs:
        run = profile_builtin(name, runs, steps=STEPS, warmup=1, threads=2, **knobs)
        v = validate(run, threads=host.cores, runs_dir=runs, steps=STEPS, budget_s=0.1 if quick else 0.25)
        return step_model_rows("projection_all_cores", PART, v, f"2 -> {host.cores} threads projection",
                               ALL_CORES_PCT)


__all__ = ["projection_all_cores", "ranks_threads", "weak_scaling"]

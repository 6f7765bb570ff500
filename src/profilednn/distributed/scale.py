"""Scaling studies on one machine: ranks x threads at a fixed global batch, and weak scaling.

Strong (seed 000, Table 3): the same global batch trained by every (ranks, threads)
combination that fits in ``cores``; throughput normalised to the smallest configuration.
More ranks with fewer threads often wins: each rank's kernels run on fewer threads, where
they are more efficient, and DDP overlaps some of the allreduce with backward.

Weak (seed 001, Figs 8-9): the local batch stays fixed while ranks are added, so the
global batch grows with them; ideal weak scaling keeps the step time flat and multiplies
images/s by the number of ranks.

Every point is a real job: ``profilednn launch`` + ``profilednn train`` in fresh
processes. The study itself is a Run (label ``scale``) with a ``scale`` table and a chart.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import polars as pl

from ..errors import InputError
from ..run import Run, create_run, load_run
from ..tables import DIST_RANKS, SCALE
from ..topology import cpu_topology
from .launch import LaunchSettings, prepare_launch, run_launch
from .merge import rank_runs
from .plan import rank_thread_grid
from .watchdog import JobFailed

SCALE_SCHEMA = SCALE.schema  # the catalogue's (profilednn.tables)
ProgressFn = Callable[[int, int, str], None]


@dataclass
class ScaleResult:
    run: Run
    table: pl.DataFrame
    notes: list[str] = field(default_factory=list)

    def pivot(self) -> pl.DataFrame:
        """Table 3's layout: one row per threads/rank, one column per rank count (normalized)."""
        return (self.table.sort(["threads", "ranks"])
                .pivot(on="ranks", index="threads", values="normalized", sort_columns=True))


def _knob_args(knobs: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key, value in knobs.items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        out += [flag] if value is True else [flag, str(value)]
    return out


def _run_point(model: str, ranks: int, threads: int, global_batch: int, steps: int, warmup: int,
               knobs: dict[str, Any], runs_dir: Path, job_id: str, timeout: float,
               measure_comm: bool = False) -> dict[str, Any]:
    command = [sys.executable, "-m", "profilednn", "train", "--model", model, "--global-batch", str(global_batch),
               "--steps", str(steps), "--warmup", str(warmup), "--job-id", job_id,
               "-o", str(runs_dir), *([] if measure_comm else ["--no-comm"]), *_knob_args(knobs)]
    settings = LaunchSettings(nproc_per_node=ranks, threads_per_rank=threads, timeout=timeout, job_id=job_id)
    prepared = prepare_launch(command, settings)
    runs_dir.mkdir(parents=True, exist_ok=True)
    run_launch(prepared, log_file=runs_dir / f"{job_id}.log")
    rank0 = rank_runs(runs_dir / job_id)[0]
    per_rank = rank0.table(DIST_RANKS)
    merged = rank0.manifest.get("merged") or {}
    return {
        "ranks": ranks, "threads": threads, "cores_used": ranks * threads, "local_batch": global_batch // ranks,
        "global_batch": global_batch, "step_ms": merged.get("step_ms"),
        "compute_ms": float(per_rank["compute_ms"].max()), "allreduce_ms": float(per_rank["allreduce_ms"].median()),
        "exposed_comm_ms": float(per_rank["exposed_comm_ms"].median()), "items_per_s": merged.get("items_per_s"),
        "job_id": job_id, "rank0_run": str(rank0.path),
    }


def _study_run(runs_dir: Path, mode: str, model: str, config: dict[str, Any]) -> Run:
    """The study's Run, for ``with _study_run(...) as run:`` (create_run's lifecycle)."""
    return create_run(runs_dir, label=f"scale-{mode}", command=["profilednn", "scale"],
                      workload={"kind": "builtin", "name": model, "config": config},
                      scale={"mode": mode, "model": model, **config})


def run_points(points: list[tuple[str, Callable[[], dict[str, Any]]]], progress: ProgressFn | None,
               tolerated: tuple[type[Exception], ...] = ()) -> tuple[list[dict[str, Any]], list[str]]:
    """Run each study point in turn with progress: the rows, and a note per point that
    raised one of ``tolerated`` (the study goes on with the others; when none measured, the
    first point's error is raised)."""
    rows: list[dict[str, Any]] = []
    failed: list[str] = []
    first: Exception | None = None
    for i, (label, point) in enumerate(points):
        if progress:
            progress(i, len(points), label)
        try:
            rows.append(point())
        except tolerated as exc:
            failed.append(f"{label}: not measured: {exc}")
            first = first or exc
    if first is not None and not rows:
        raise first
    if progress:
        progress(len(points), len(points), "done")
    return rows, failed


def finish_study(run: Run, rows: list[dict[str, Any]], mode: str, notes: list[str]) -> ScaleResult:
    table = pl.DataFrame([{**r, "mode": mode} for r in rows], schema=SCALE_SCHEMA)
    from .charts import scale_chart
    from .studies import complete_study

    complete_study(run, SCALE, table, scale_chart(table), notes=notes)
    return ScaleResult(run=load_run(run.path), table=table, notes=notes)


def scale_sweep(
    model: str,
    cores: int,
    global_batch: int | None = None,
    *,
    ranks: list[int] | None = None,
    threads: list[int] | None = None,
    steps: int = 8,
    warmup: int = 2,
    runs_dir: Path | str = "runs",
    timeout: float = 1800.0,
    progress: ProgressFn | None = None,
    **knobs: Any,
) -> ScaleResult:
    """Table 3: every (ranks, threads) with ranks x threads <= ``cores`` at one global batch."""
    machine = cpu_topology().physical_cores
    if cores > machine:
        raise InputError(f"--cores {cores} is more than this machine's {machine} physical cores")
    grid = rank_thread_grid(cores, ranks, threads)
    if global_batch is None:
        global_batch = 4 * max(r for r, _ in grid) if grid else 4
    notes: list[str] = []
    skipped = sorted({r for r, _ in grid if global_batch % r})
    if skipped:
        notes.append(f"skipped {', '.join(map(str, skipped))} ranks: global batch {global_batch} does not split evenly")
    grid = [(r, t) for r, t in grid if global_batch % r == 0]
    if not grid:
        raise InputError(f"no ranks x threads combination fits {cores} cores with global batch {global_batch}")
    config = {"cores": cores, "global_batch": global_batch, "steps": steps, "warmup": warmup, **knobs}
    with _study_run(Path(runs_dir), "strong", model, config) as run:  # failed when no point measured
        rows, failed = run_points([
            (f"{r} ranks x {t} threads",
             lambda r=r, t=t: _run_point(model, r, t, global_batch, steps, warmup, knobs, run.path / "jobs",
                                         f"r{r}t{t}", timeout))
            for r, t in grid], progress, (JobFailed,))
        notes += failed
        base = min(rows, key=lambda row: (row["ranks"] * row["threads"], row["ranks"]))
        for row in rows:
            row["normalized"] = row["items_per_s"] / base["items_per_s"] if base["items_per_s"] else None
            row["efficiency"] = (row["normalized"] / (row["cores_used"] / base["cores_used"])
                                 if row["normalized"] is not None else None)
        notes.append(f"normalized to {base['ranks']} rank(s) x {base['threads']} thread(s) = 1.00 (Table 3's corner)")
        return finish_study(run, rows, "strong", notes)


def weak_scaling(
    model: str,
    cores: int,
    local_batch: int,
    *,
    ranks: list[int] | None = None,
    threads_per_rank: int = 1,
    steps: int = 8,
    warmup: int = 2,
    runs_dir: Path | str = "runs",
    timeout: float = 1800.0,
    progress: ProgressFn | None = None,
    **knobs: Any,
) -> ScaleResult:
    """Fixed local batch, growing rank count: step time and images/s per rank count."""
    machine = cpu_topology().physical_cores
    if cores > machine:
        raise InputError(f"--cores {cores} is more than this machine's {machine} physical cores")
    if local_batch < 1:
        raise InputError(f"--batch-size must be >= 1, not {local_batch}")
    rank_list = [r for r, _ in rank_thread_grid(cores, ranks, [threads_per_rank])]
    if not rank_list:
        raise InputError(f"{threads_per_rank} threads per rank do not fit in {cores} cores")
    config = {"cores": cores, "local_batch": local_batch, "threads_per_rank": threads_per_rank, "steps": steps,
              "warmup": warmup, **knobs}
    with _study_run(Path(runs_dir), "weak", model, config) as run:  # failed when no point measured
        rows, failed = run_points([
            (f"{r} ranks",
             lambda r=r: _run_point(model, r, threads_per_rank, local_batch * r, steps, warmup, knobs,
                                    run.path / "jobs", f"weak-r{r}", timeout, measure_comm=r > 1))
            for r in rank_list], progress, (JobFailed,))
        base = min(rows, key=lambda row: row["ranks"])
        for row in rows:
            row["normalized"] = row["items_per_s"] / base["items_per_s"] if base["items_per_s"] else None
            row["efficiency"] = row["normalized"] / (row["ranks"] / base["ranks"]) if row["normalized"] else None
        notes = [f"weak scaling: local batch {local_batch} per rank, global batch = ranks x {local_batch}; "
                 "efficiency = throughput / (ranks x one rank's throughput)", *failed]
        multi = [row for row in rows if row["ranks"] > 1]
        if multi:
            notes.append(f"project to more nodes: profilednn project-nodes {multi[-1]['rank0_run']}")
        return finish_study(run, rows, "weak", notes)


__all__ = ["SCALE_SCHEMA", "ProgressFn", "ScaleResult", "finish_study", "run_points", "scale_sweep", "weak_scaling"]

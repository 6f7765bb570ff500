"""The merged multi-rank view: per-rank compute vs communication, and stragglers.

In synchronous data parallelism every rank waits at each allreduce for the slowest
one, so a straggler shows up twice: its own compute time is longer, and the other
ranks' allreduce time grows by the time they wait for it. The view ranks each rank by
its median compute time against the median over ranks; one more than ``threshold``
(10 %) slower is a straggler.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from ..errors import RunError
from ..run import Run, iter_runs
from ..tables import DIST_RANKS, DIST_STEPS

STEP_SCHEMA = DIST_STEPS.schema  # the catalogue's (profilednn.tables)
STRAGGLER_THRESHOLD = 0.10


@dataclass
class MergedView:
    """Every rank's steps, a per-rank summary, and the job's step time."""

    steps: pl.DataFrame  # one row per (rank, step)
    per_rank: pl.DataFrame  # one row per rank
    stragglers: list[int]
    step_ms: float | None  # median over steps of the slowest rank's step time

    def items_per_s(self, global_batch: int) -> float | None:
        return global_batch / (self.step_ms / 1e3) if self.step_ms else None


def merge_rank_steps(steps: pl.DataFrame, *, warmup: int = 1,
                     threshold: float = STRAGGLER_THRESHOLD) -> MergedView:
    """Summarise ``steps`` (STEP_SCHEMA rows of every rank); the first ``warmup`` steps
    of each rank are left out of the medians (when a rank has more than that)."""
    if steps.height == 0:
        return MergedView(steps, pl.DataFrame(), [], None)
    ranked = steps.sort(["rank", "step"]).with_columns(
        pl.int_range(pl.len()).over("rank").alias("_i"), pl.len().over("rank").alias("_n"))
    kept = ranked.filter((pl.col("_i") >= warmup) | (pl.col("_n") <= warmup)).drop("_i", "_n")
    slowest = (kept.sort("compute_ms", descending=True).group_by("step", maintain_order=True)
               .agg(pl.col("rank").first().alias("slowest_rank")))
    per_rank = (
        kept.group_by("rank").agg(
            pl.len().alias("steps"),
            pl.col("time_ms").median().alias("step_ms"),
            pl.col("compute_ms").median().alias("compute_ms"),
            pl.col("allreduce_ms").median().alias("allreduce_ms"),
            pl.col("exposed_comm_ms").median().alias("exposed_comm_ms"),
            pl.col("data_ms").median().alias("data_ms"),
            pl.col("time_ms").min().alias("step_min_ms"),
            pl.col("time_ms").max().alias("step_max_ms"),
            pl.col("allreduce_bytes").median().alias("allreduce_bytes"),
        )
        .join(slowest.group_by("slowest_rank").agg(pl.len().alias("slowest_steps"))
              .rename({"slowest_rank": "rank"}), on="rank", how="left")
        .with_columns(pl.col("slowest_steps").fill_null(0))
        .sort("rank")
    )
    mid = float(per_rank["compute_ms"].median() or 0.0)
    per_rank = per_rank.with_columns(
        (pl.col("exposed_comm_ms") / pl.col("step_ms")).alias("comm_share"),
        (pl.col("compute_ms") / mid if mid > 0 else pl.lit(1.0)).alias("slowdown"),
    ).with_columns((pl.col("slowdown") > 1.0 + threshold).alias("straggler"))
    per_rank = per_rank.cast(DIST_RANKS.schema).select(list(DIST_RANKS.schema))  # the catalogue's columns
    stragglers = per_rank.filter(pl.col("straggler"))["rank"].to_list()
    job_step = kept.group_by("step").agg(pl.col("time_ms").max())["time_ms"].median()
    return MergedView(kept, per_rank, stragglers, float(job_step) if job_step is not None else None)


def rank_runs(job_dir: Path | str) -> list[Run]:
    """The newest attempt's Run of each rank under ``job_dir`` (runs/<job>), by rank."""
    latest: dict[int, Run] = {}
    for run in iter_runs(job_dir):
        d = run.manifest.get("distributed") or {}
        if "rank" not in d:
            continue
        r = int(d["rank"])
        key = (int(d.get("attempt", 0)), run.id)
        if r not in latest or key > (int(latest[r].manifest["distributed"].get("attempt", 0)), latest[r].id):
            latest[r] = run
    if not latest:
        raise RunError(f"{job_dir} holds no rank Runs (written by `profilednn train`)")
    return [latest[r] for r in sorted(latest)]


def merge_job(job_dir: Path | str, *, warmup: int = 1, threshold: float = STRAGGLER_THRESHOLD) -> MergedView:
    """Merge the per-rank Runs of one job from disk (works after a failed job too)."""
    frames = [run.table(DIST_STEPS) for run in rank_runs(job_dir) if run.has_table(DIST_STEPS)]
    if not frames:
        raise RunError(f"no rank of {job_dir} recorded a step")
    return merge_rank_steps(pl.concat(frames, how="vertical"), warmup=warmup, threshold=threshold)


__all__ = ["MergedView", "STEP_SCHEMA", "STRAGGLER_THRESHOLD", "merge_job", "merge_rank_steps", "rank_runs"]

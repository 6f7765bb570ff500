"""The native kernels' calibration: in-situ time over cold replay time, per op family.

A cold replay alone misses part of what an op pays inside its step; the ratio measured at
the Run's own thread count carries that to the target (the step model's ``native kernels``
part, ``step_model.py``).
"""

from __future__ import annotations

import polars as pl


# In-situ/replay factors seen on real Runs lie around 0.5-2.5 (cold replays a little slower
# or faster than the op inside its step); one far outside means the replay at A was timed
# while something else held the cores (0.02 was seen so).
CALIBRATION_BOUNDS = (0.2, 5.0)


def native_calibration(otab: pl.DataFrame, replay_a: dict[str, float | None]) -> pl.DataFrame:
    """Per op family: in-situ time / cold replay time, both at the Run's own threads (A).

    ``otab``: the projection's op table (``case_id``, ``family``, ``calls_per_step``,
    ``in_situ_total_ms`` per step); ``replay_a``: case id -> replay ms per call at A.
    A replay, even cold, misses part of what an op pays inside a step (fresh pages for its
    outputs, other tensors' traffic); the ratio measured at A carries that to the target,
    on the assumption that it does not depend on the thread count (``bench_projection.py
    --validate`` prints it at each thread count to check). Columns: family, in_situ_ms,
    replay_a_ms, factor (1.0 where nothing was replayed), used (the factor lies within
    ``CALIBRATION_BOUNDS``: outside them the replay at A was disturbed, e.g. by another
    process, and scaling by it would carry that disturbance to the target).
    """
    schema = {"family": pl.Utf8, "in_situ_ms": pl.Float64, "replay_a_ms": pl.Float64,
              "factor": pl.Float64, "used": pl.Boolean}
    if otab.is_empty() or not replay_a:
        return pl.DataFrame(schema=schema)
    ra = pl.DataFrame({"case_id": list(replay_a), "replay_a": list(replay_a.values())},
                      schema={"case_id": pl.Utf8, "replay_a": pl.Float64})
    t = otab.join(ra, on="case_id", how="inner").filter(pl.col("replay_a").is_not_null())
    if t.is_empty():
        return pl.DataFrame(schema=schema)
    # each call once: without the time inside conv calls, and without the replays of calls
    # a replayed container already holds (columns from nesting.per_unique_op, if known)
    in_situ, calls = pl.col("in_situ_total_ms"), pl.col("calls_per_step")
    if {"conv_ms_per_step", "nested_calls_per_step"} <= set(t.columns):
        in_situ = in_situ - pl.col("conv_ms_per_step").fill_null(0.0)
        calls = calls - pl.col("nested_calls_per_step").fill_null(0.0)
    return (t.group_by("family").agg(
        in_situ.sum().alias("in_situ_ms"),
        (calls * pl.col("replay_a")).sum().alias("replay_a_ms"))
        .with_columns(pl.when(pl.col("replay_a_ms") > 0)
                      .then(pl.col("in_situ_ms") / pl.col("replay_a_ms"))
                      .otherwise(1.0).alias("factor"))
        .with_columns(pl.col("factor").is_between(*CALIBRATION_BOUNDS).alias("used"))
        .select(*schema).sort("in_situ_ms", descending=True))


def calibrate_ops(otab: pl.DataFrame, calibration: pl.DataFrame) -> pl.DataFrame:
    """Add ``calibrated_ms`` = replay_ms x the family's in-situ/replay factor (A's), for the
    families whose factor is ``used`` (the others keep their plain replay)."""
    if otab.is_empty() or calibration.is_empty():
        return otab
    f = calibration.filter(pl.col("used")).select("family", pl.col("factor").alias("_f"))
    return (otab.join(f, on="family", how="left")
            .with_columns((pl.col("replay_ms") * pl.col("_f")).alias("calibrated_ms"))
            .drop("_f"))


__all__ = ["CALIBRATION_BOUNDS", "calibrate_ops", "native_calibration"]

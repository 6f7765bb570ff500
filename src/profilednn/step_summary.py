"""A captured Run at a glance: step-time statistics from its ``steps`` table and forward /
backward time per leaf layer from its ``layers`` table.

The capture printer shows them right after a capture (no analysis package, no torch
needed to read them) and the analysis facade builds its breakdowns on them.
"""

from __future__ import annotations

import polars as pl

from .vocabulary import PSEUDO_MODULES


def step_stats(steps: pl.DataFrame) -> dict[str, float]:
    """Median step time and its spread (min, p10, p90, max), in ms."""
    t = steps["time_ms"].drop_nulls()
    if t.len() == 0:
        return {}
    return {
        "steps": float(t.len()),
        "median_ms": float(t.median()),
        "mean_ms": float(t.mean()),
        "min_ms": float(t.min()),
        "p10_ms": float(t.quantile(0.1, interpolation="nearest")),
        "p90_ms": float(t.quantile(0.9, interpolation="nearest")),
        "max_ms": float(t.max()),
    }


def fwd_bwd_by_layer(layers: pl.DataFrame, n_steps: int) -> pl.DataFrame:
    """Forward and backward time per leaf module, with their ratio."""
    leaf = layers.filter(~pl.col("module").is_in(list(PSEUDO_MODULES)))
    if "leaf" in leaf.columns:
        leaf = leaf.filter(pl.col("leaf").fill_null(True))
    per = leaf.group_by(["module", "module_type"]).agg(
        forward_ms=pl.col("time_ms").filter(pl.col("phase") == "forward").sum() / n_steps,
        backward_ms=pl.col("time_ms").filter(pl.col("phase") == "backward").sum() / n_steps,
    )
    return per.with_columns(
        total_ms=pl.col("forward_ms") + pl.col("backward_ms"),
        bwd_fwd_ratio=pl.when(pl.col("forward_ms") > 0)
        .then(pl.col("backward_ms") / pl.col("forward_ms"))
        .otherwise(None),
    ).sort(["total_ms", "module"], descending=[True, False])


__all__ = ["fwd_bwd_by_layer", "step_stats"]

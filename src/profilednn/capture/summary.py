"""The layer-wise table ``profilednn profile`` prints (seed 001's per-layer fwd/bwd time)."""

from __future__ import annotations

import polars as pl

from ..run import Run

PSEUDO = ("loss", "optimizer", "data")


def layer_table(run: Run, *, leaf_only: bool = True) -> pl.DataFrame:
    """Per module: mean forward and backward ms per step and share of the mean step time.

    Rows are modules in order of total time, then the pseudo-modules ``loss``,
    ``optimizer`` and ``data``.
    """
    layers = run.layers
    steps = run.steps
    n = max(1, steps.height)
    step_ms = float(steps["time_ms"].mean()) if steps.height and steps["time_ms"].null_count() < steps.height else 0.0
    mods = layers.filter(~pl.col("module").is_in(PSEUDO))
    if leaf_only:
        mods = mods.filter(pl.col("leaf"))
    wide = (mods.group_by(["module", "module_type", "phase"]).agg(pl.col("time_ms").sum() / n)
            .pivot(on="phase", index=["module", "module_type"], values="time_ms"))
    for col in ("forward", "backward", "loss"):
        if col not in wide.columns:
            wide = wide.with_columns(pl.lit(0.0).alias(col))
    wide = wide.with_columns(
        pl.col("forward").fill_null(0.0).alias("forward_ms"),
        pl.col("backward").fill_null(0.0).alias("backward_ms"),
    ).with_columns((pl.col("forward_ms") + pl.col("backward_ms")).alias("total_ms"))
    pseudo = (layers.filter(pl.col("module").is_in(PSEUDO)).group_by("module")
              .agg((pl.col("time_ms").sum() / n).alias("total_ms"))
              .with_columns(pl.col("module").alias("module_type"), pl.lit(0.0).alias("forward_ms"),
                            pl.lit(0.0).alias("backward_ms")))
    cols = ["module", "module_type", "forward_ms", "backward_ms", "total_ms"]
    out = pl.concat([wide.select(cols).sort("total_ms", descending=True),
                     pseudo.select(cols).sort("module")], how="vertical_relaxed")
    share = (pl.col("total_ms") / step_ms * 100.0) if step_ms > 0 else pl.lit(None, pl.Float64)
    return out.with_columns(share.alias("share_pct"))


def step_summary(run: Run) -> dict[str, float | None]:
    """Median step time and its spread, and mean phase times, in ms."""
    s = run.steps
    if s.is_empty():
        return {"steps": 0, "median_ms": None, "min_ms": None, "max_ms": None}
    t = s["time_ms"].drop_nulls()
    out: dict[str, float | None] = {
        "steps": float(s.height),
        "median_ms": float(t.median()) if t.len() else None,
        "min_ms": float(t.min()) if t.len() else None,
        "max_ms": float(t.max()) if t.len() else None,
    }
    for ph in ("data", "forward", "loss", "backward", "optimizer", "other"):
        col = f"{ph}_ms"
        if col in s.columns:
            out[col] = float(s[col].mean())
    return out

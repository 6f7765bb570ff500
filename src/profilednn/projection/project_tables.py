"""The projection's third stage: the replay times made into tables.

One row per unique primitive and per unique op (replay time, roofline, projected time per
step), each in-situ row attributed its projected time (driver, module, phase), and the
breakdown by driver, layer and phase.
"""

from __future__ import annotations

import polars as pl

from ..run import Run
from ..tables import OP_EVENTS
from .cases import PRIM_KEY
from ..hardware.machine import MachineProfile
from .nesting import OPS_KEY, nested_calls, taken_out
from .replay import ReplayResult, match_primitives
from ..hardware.roofline import add_roofline
from ..vocabulary import cfg_dtype

OP_KEY = ["op", "input_shapes", "dtypes"]  # a unique framework op


def _projected(tab: pl.DataFrame) -> pl.DataFrame:
    return tab.with_columns(
        (pl.col("calls_per_step") * pl.coalesce("replay_ms", "in_situ_ms")).alias("projected_ms"))


def primitive_table(unique: pl.DataFrame, result: ReplayResult, steps: int, machine: MachineProfile,
                    threads: int) -> pl.DataFrame:
    """Per unique primitive: its replay matched, its roofline and projected ms per step."""
    if unique.is_empty():
        return pl.DataFrame()
    ptab = match_primitives(unique, result).with_columns(
        (pl.col("calls") / steps).alias("calls_per_step"),
        (pl.col("in_situ_total_ms") / steps).alias("in_situ_total_ms"),
        pl.col("src_dt").map_elements(cfg_dtype, return_dtype=pl.Utf8).alias("dtype"),
    )
    return _projected(add_roofline(ptab, machine, threads))


def op_table(uops: pl.DataFrame, result: ReplayResult, steps: int, machine: MachineProfile,
             threads: int) -> pl.DataFrame:
    """Per unique framework op: its replay wall time (or why not), roofline and projected ms."""
    if uops.is_empty():
        return pl.DataFrame()
    wall, errs = [], []
    for cid in uops["case_id"].to_list():
        res = result.cases.get(cid) or {}
        wall.append(result.wall_ms(cid))
        errs.append(f"replay failed: {res['error']}" if res.get("error") else None)
    otab = uops.with_columns(
        pl.Series("replay_ms", wall, dtype=pl.Float64),
        pl.coalesce(pl.Series("_err", errs, dtype=pl.Utf8), pl.col("note")).alias("note"),
        (pl.col("calls") / steps).alias("calls_per_step"),
        (pl.col("in_situ_total_ms") / steps).alias("in_situ_total_ms"),
    )
    return _projected(add_roofline(otab, machine, threads))


def nesting(run: Run, otab: pl.DataFrame) -> tuple[pl.DataFrame | None, pl.DataFrame | None]:
    """The op calls nested in other ops (``nesting.py``), and per ops key the calls another
    replayed item already holds (None where there are none to count)."""
    nested = nested_calls(run.table(OP_EVENTS)) if run.has_table(OP_EVENTS) else None
    if nested is not None and nested.is_empty():
        nested = None
    out = taken_out(nested, otab) if nested is not None and not otab.is_empty() else None
    return nested, out


def _primitive_rows(prims: pl.DataFrame, ptab: pl.DataFrame) -> pl.DataFrame:
    keys = [k for k in PRIM_KEY if k in prims.columns]
    per = ptab.select(*keys, "replay_ms", "attainable_ms")
    rows = prims.join(per, on=keys, how="left", nulls_equal=True)
    return rows.select(
        pl.col("driver"), pl.col("module") if "module" in rows.columns else pl.lit(None, pl.Utf8).alias("module"),
        pl.col("phase") if "phase" in rows.columns else pl.lit(None, pl.Utf8).alias("phase"),
        pl.col("time_ms").alias("in_situ"),
        pl.coalesce("replay_ms", "time_ms").alias("projected"),
        pl.col("attainable_ms").fill_null(0.0).alias("attainable"))


def _op_rows(ops: pl.DataFrame, otab: pl.DataFrame, out: pl.DataFrame | None) -> pl.DataFrame:
    per = otab.select(*OP_KEY, "replay_ms", "attainable_ms", "in_situ_ms")
    rows = ops.join(per, on=OP_KEY, how="left", nulls_equal=True)
    # a call inside a replayed op (clamp_min_ in relu_) is in that op's replay already
    covered = pl.lit(0)
    if out is not None:
        keys = [k for k in OPS_KEY if k in rows.columns]
        cov = out.group_by(keys).agg(pl.col("covered_calls").sum())
        rows = rows.join(cov, on=keys, how="left", nulls_equal=True)
        covered = pl.col("covered_calls").fill_null(0)
    return rows.select(
        pl.format("aten:{}", pl.col("family")).alias("driver"), pl.col("module"), pl.col("phase"),
        pl.col("self_time_ms").alias("in_situ"),
        ((pl.col("calls") - covered) * pl.coalesce("replay_ms", "in_situ_ms")).alias("projected"),
        (pl.col("calls") * pl.col("attainable_ms").fill_null(0.0)).alias("attainable"))


def attributed_rows(prims: pl.DataFrame, ptab: pl.DataFrame, ops: pl.DataFrame, otab: pl.DataFrame,
                    out: pl.DataFrame | None) -> pl.DataFrame:
    """Every in-situ row (primitive or op call) with its in-situ, projected and attainable
    time, and its driver, module and phase."""
    frames = []
    if not ptab.is_empty():
        frames.append(_primitive_rows(prims, ptab))
    if not otab.is_empty():
        frames.append(_op_rows(ops, otab, out))
    return pl.concat(frames, how="vertical_relaxed")


def _level_rows(level: str, frame: pl.DataFrame, col: str, steps: int) -> pl.DataFrame:
    return (frame.group_by(pl.col(col).fill_null("(none)").alias("name"))
            .agg((pl.col("in_situ") .sum() / steps).alias("in_situ_ms"),
                 (pl.col("projected").sum() / steps).alias("projected_ms"),
                 (pl.col("attainable").sum() / steps).alias("attainable_ms"))
            .with_columns(pl.lit(level).alias("level"),
                          (pl.col("projected_ms") / pl.col("in_situ_ms")).alias("efficiency")))


def breakdown_table(rows: pl.DataFrame, steps: int) -> pl.DataFrame:
    """Per step, by driver, layer and phase: in-situ, projected and attainable ms."""
    return pl.concat([_level_rows("driver", rows, "driver", steps),
                      _level_rows("layer", rows, "module", steps),
                      _level_rows("phase", rows, "phase", steps)], how="vertical_relaxed"
                     ).select("level", "name", "in_situ_ms", "projected_ms", "efficiency", "attainable_ms")


__all__ = ["OP_KEY", "attributed_rows", "breakdown_table", "nesting", "op_table", "primitive_table"]

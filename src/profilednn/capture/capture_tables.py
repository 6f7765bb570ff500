"""The capture's tables, one function each, from what a session observed.

``CaptureSession`` (``session.py``) calls them in order once the observation window has
closed: the profiler's op events (attributed to module, phase and step by the markers'
timeline), each primitive's innermost framework op, the ``ops`` aggregate, ``layers`` and
``steps``. Steps are renumbered to measured indices (warm-up dropped) by ``renumber``.
"""

from __future__ import annotations

from typing import Any

import polars as pl
import torch

from ..tables import PHASES, STEPS
from .attribute import Timeline, attribute_by_time, innermost_ops

EVENT_SCHEMA = {"op": pl.Utf8, "start_ms": pl.Float64, "dur_ms": pl.Float64, "self_ms": pl.Float64,
                "tid": pl.Int64, "depth": pl.Int64, "parent": pl.Int64,
                "input_shapes": pl.Utf8, "dtypes": pl.Utf8}
OPS_KEYS = ["op", "module", "module_type", "phase", "input_shapes", "dtypes", "step"]


def renumber(df: pl.DataFrame, keep: dict[int, int]) -> pl.DataFrame:
    """Rows of the measured steps only, their ``step`` the measured index (``keep``)."""
    if df.is_empty() or "step" not in df.columns:
        return df
    mapping = pl.DataFrame({"step": list(keep), "_m": list(keep.values())},
                           schema={"step": pl.Int64, "_m": pl.Int64})
    return (df.join(mapping, on="step", how="inner").drop("step").rename({"_m": "step"}))


def with_module_type(df: pl.DataFrame, module_types: dict[str, str]) -> pl.DataFrame:
    """``df`` with the ``module_type`` of each row's module."""
    if df.is_empty():
        return df.with_columns(pl.lit(None, pl.Utf8).alias("module_type"))
    return df.with_columns(
        pl.col("module").replace_strict(module_types, default=None, return_dtype=pl.Utf8)
        .alias("module_type")
    )


def _event_rows(events: list[Any], base_ms: float) -> list[tuple]:
    """One row per CPU event (parents before their children), with depth and parent index."""
    # Longest first on equal starts, so a parent always precedes its children.
    events.sort(key=lambda e: (e.time_range.start, -(e.time_range.end - e.time_range.start)))
    index = {id(e): i for i, e in enumerate(events)}
    depths: list[int] = []
    rows = []
    for e in events:
        parent = index.get(id(e.cpu_parent), -1) if e.cpu_parent is not None else -1
        # A parent starts before its children, so its depth is already known.
        depth = depths[parent] + 1 if parent >= 0 else 0
        depths.append(depth)
        rows.append((
            e.name,
            base_ms + e.time_range.start / 1000.0,
            (e.time_range.end - e.time_range.start) / 1000.0,
            e.self_cpu_time_total / 1000.0,
            int(e.thread),
            depth,
            parent,
            str(e.input_shapes) if e.input_shapes else "",
            str(e.input_dtypes) if getattr(e, "input_dtypes", None) else "",
        ))
    return rows


# glibc's largest mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX): a buffer above it is
# mapped afresh at every allocation and unmapped at its free, whatever the heap holds.
GLIBC_MMAP_THRESHOLD_MAX = 32 * 2**20


def profiler_events(prof: torch.profiler.profile) -> tuple[pl.DataFrame, list[tuple[float, int]]]:
    """The profiler's CPU op events (``EVENT_SCHEMA`` + ``event_id``) and the start time
    (ms) and size (bytes) of every allocation."""
    results = prof.profiler.kineto_results
    base_ms = results.trace_start_ns() / 1e6
    # Every allocator call (frees have negative sizes); FunctionEvents only keep those
    # that happen outside any op, so read the raw kineto events.
    allocs = [(e.start_ns() / 1e6, e.nbytes()) for e in results.events()
              if e.name() == "[memory]" and e.nbytes() > 0]
    events = [e for e in prof.events() if not e.is_async]
    events = [e for e in events if e.name != "[memory]" and e.device_type.name == "CPU"]
    df = pl.DataFrame(_event_rows(events, base_ms), schema=EVENT_SCHEMA, orient="row").with_row_index("event_id")
    return df.with_columns(pl.col("event_id").cast(pl.Int64)), allocs


def attributed_events(events: pl.DataFrame, tl: Timeline, module_types: dict[str, str]) -> pl.DataFrame:
    """Op events with the module, phase and step of the timeline state they ran in (``at_marker``);
    an op that began before the window opened (the ``optimizer.step()`` whose hook opened it)
    is left out: the profiler saw only its end."""
    if tl.window is not None:
        events = events.filter(pl.col("start_ms") >= tl.window[0])
    at = at_marker(events, tl.states)
    return with_module_type(attribute_by_time(at, tl.states, "at_ms").drop("at_ms"), module_types)


def at_marker(events: pl.DataFrame, states: pl.DataFrame) -> pl.DataFrame:
    """``events`` with ``at_ms``, the time whose state an op takes: the first marker inside the
    op when it holds one, else its start. The ops that hold markers are the ranges around
    ProfileDNN's Python hooks: autograd's ``evaluate_function`` opens just before a gradient
    node's pre-hook writes the module's backward marker, torch's ``optimizer.step()`` range
    just before the pre-hook's optimizer marker (its post-hook then ends the step). How much
    of the op comes before that marker is timing (a hook that waits for the CPU), the order is
    not: the op's own work follows the marker."""
    marks = states.select(pl.col("time_ms").alias("start_ms"), pl.col("time_ms").alias("_mark")).sort("start_ms")
    inside = pl.col("_mark").is_not_null() & (pl.col("_mark") <= pl.col("start_ms") + pl.col("dur_ms"))
    return (events.sort("start_ms").join_asof(marks, on="start_ms", strategy="forward")
            .with_columns(pl.when(inside).then(pl.col("_mark")).otherwise(pl.col("start_ms")).alias("at_ms"))
            .drop("_mark"))


def allocations_per_step(allocs: list[tuple[float, int]], tl: Timeline,
                         keep: dict[int, int]) -> dict[int, tuple[int, float]]:
    """Per measured step: its allocations, and the MiB of those above glibc's largest mmap
    threshold (mapped afresh, and page-faulted in, every step under the default allocator)."""
    if not allocs:
        return {}
    frame = outside_evaluations(
        pl.DataFrame(allocs, schema={"start_ms": pl.Float64, "nbytes": pl.Int64}, orient="row"),
        tl.spans, "start_ms")
    a = renumber(attribute_by_time(frame, tl.states, "start_ms"), keep)
    per_step = a.group_by("step").agg(
        pl.len().alias("n"),
        (pl.col("nbytes").filter(pl.col("nbytes") > GLIBC_MMAP_THRESHOLD_MAX).sum() / 2**20).alias("mib"))
    return {step: (n, float(mib or 0.0)) for step, n, mib in per_step.iter_rows()}


def outside_evaluations(df: pl.DataFrame, spans: pl.DataFrame, time_col: str) -> pl.DataFrame:
    """The rows of ``df`` whose ``time_col`` lies outside every evaluation call (spans of kind
    ``eval``): an evaluation's allocations are not the training step's."""
    evals = spans.filter(pl.col("kind") == "eval").sort("start_ms")
    if evals.is_empty() or df.is_empty():
        return df
    bounds = evals.select(pl.col("start_ms").alias(time_col), pl.col("end_ms").alias("_eval_end"))
    return (df.sort(time_col).join_asof(bounds, on=time_col, strategy="backward")
            .filter(pl.col("_eval_end").is_null() | (pl.col(time_col) > pl.col("_eval_end")))
            .drop("_eval_end"))


def primitive_ops(prims: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """Name each primitive's innermost containing framework op (by timestamp)."""
    if prims.is_empty() or ops.is_empty():
        return prims.with_columns(pl.lit(None, pl.Utf8).alias("op"),
                                  pl.lit(None, pl.Int64).alias("op_event"))
    main_tid = ops.group_by("tid").agg(pl.col("self_ms").sum()).sort("self_ms").row(-1)[0]
    ev = ops.filter(pl.col("tid") == main_tid).sort("start_ms")
    ids = ev["event_id"].to_list()
    pos = {eid: i for i, eid in enumerate(ids)}
    parent_pos = [pos.get(p, -1) for p in ev["parent"].to_list()]
    starts = ev["start_ms"].to_list()
    ends = [s + d for s, d in zip(starts, ev["dur_ms"].to_list())]
    idx = innermost_ops(prims["timestamp_ms"].to_list(), starts, ends, parent_pos)
    names = ev["op"].to_list()
    return prims.with_columns(
        pl.Series("op", [names[i] if i >= 0 else None for i in idx], dtype=pl.Utf8),
        pl.Series("op_event", [ids[i] if i >= 0 else None for i in idx], dtype=pl.Int64),
    )


def ops_table(op_events: pl.DataFrame, prims: pl.DataFrame) -> pl.DataFrame:
    """The ``ops`` table: op events aggregated per op, module, phase, shapes, dtypes and
    step, with the oneDNN time of the primitives each ran."""
    if op_events.is_empty():
        return pl.DataFrame(schema={**{k: pl.Utf8 for k in OPS_KEYS[:-1]}, "step": pl.Int64,
                                    "calls": pl.UInt32, "self_time_ms": pl.Float64,
                                    "total_time_ms": pl.Float64, "onednn_ms": pl.Float64})
    onednn = (prims.filter(pl.col("op_event").is_not_null())
              .group_by("op_event").agg(pl.col("time_ms").sum().alias("onednn_ms"))
              .rename({"op_event": "event_id"}))
    ev = op_events.join(onednn, on="event_id", how="left").with_columns(pl.col("onednn_ms").fill_null(0.0))
    return (ev.group_by(OPS_KEYS).agg(
        pl.len().alias("calls"),
        pl.col("self_ms").sum().alias("self_time_ms"),
        pl.col("dur_ms").sum().alias("total_time_ms"),
        pl.col("onednn_ms").sum().alias("onednn_ms"),
    ).sort(["step", "self_time_ms"], descending=[False, True]))


def _faults_sum() -> pl.Expr:
    """The faults of a group of spans: their sum, null when any span's are not counted (a log
    written before markers carried them, or a platform without ``getrusage``)."""
    return (pl.when(pl.col("faults").is_null().any()).then(None)
            .otherwise(pl.col("faults").sum()).cast(pl.Int64).alias("faults"))


def _timed_rows(spans: pl.DataFrame) -> pl.DataFrame:
    """Module calls and the loss, optimizer and data phases: calls and time per step."""
    mods = spans.filter(pl.col("kind") == "module").with_columns(
        (pl.col("end_ms") - pl.col("start_ms")).alias("time_ms"))
    faults = _faults_sum()
    mod_rows = mods.group_by(["name", "module_type", "phase", "step"]).agg(
        pl.len().alias("calls"), pl.col("time_ms").sum(), faults)
    phases = spans.filter((pl.col("kind") == "phase") & pl.col("phase").is_in(["loss", "optimizer", "data"]))
    phase_rows = (phases.with_columns((pl.col("end_ms") - pl.col("start_ms")).alias("time_ms"))
                  .group_by(["name", "phase", "step"]).agg(pl.len().alias("calls"), pl.col("time_ms").sum(), faults)
                  .with_columns(pl.col("name").alias("module_type")))
    cols = ("name", "module_type", "phase", "step", "calls", "time_ms", "faults")
    return pl.concat([mod_rows.select(*cols), phase_rows.select(*cols)],
                     how="vertical_relaxed").rename({"name": "module"})


def layers_table(spans: pl.DataFrame, info: dict[str, dict[str, Any]]) -> pl.DataFrame:
    """The ``layers`` table: per module (and timed phase) and step, calls, time and the
    module's parameters (``info``: the instrumentation's per-module facts)."""
    meta = pl.DataFrame(
        [(k, v["params"], v["trainable_params"], v["leaf"]) for k, v in info.items()],
        schema={"module": pl.Utf8, "params": pl.Int64, "trainable_params": pl.Int64, "leaf": pl.Boolean},
        orient="row",
    )
    df = _timed_rows(spans).join(meta, on="module", how="left").with_columns(
        pl.col("calls").cast(pl.Int64),
        pl.col("params").fill_null(0), pl.col("trainable_params").fill_null(0),
        pl.col("leaf").fill_null(True),
    )
    return df.select("module", "module_type", "phase", "calls", "time_ms", "params",
                     "trainable_params", "leaf", "step", "faults").sort(["step", "phase", "time_ms"],
                                                              descending=[False, False, True])


def steps_table(spans: pl.DataFrame, tl: Timeline, keep: dict[int, int], losses: dict[int, float],
                allocations: dict[int, tuple[int, float]] | None) -> pl.DataFrame:
    """The ``steps`` table: per measured step its wall time, loss, time per phase,
    allocations and the MiB of them glibc maps afresh (``allocations`` None: not counted,
    no profiler ran)."""
    per_phase: dict[tuple[int, str], float] = {
        (st, ph): d for st, ph, d in (
            spans.filter(pl.col("kind") == "phase")
            .group_by(["step", "phase"]).agg((pl.col("end_ms") - pl.col("start_ms")).sum())
            .iter_rows())
    }
    rows = []
    for g, m in sorted(keep.items(), key=lambda kv: kv[1]):
        start, end = tl.step_bounds.get(g, (None, None))
        row: dict[str, Any] = {"step": m, "time_ms": (end - start) if start is not None else None,
                               "loss": losses.get(g)}
        row.update({f"{ph}_ms": per_phase.get((m, ph), 0.0) for ph in PHASES})
        counted = allocations.get(m) if allocations is not None else None
        row["allocations"], row["mapped_alloc_mib"] = counted if counted is not None else (None, None)
        rows.append(row)
    return STEPS.frame(rows)


__all__ = ["allocations_per_step", "at_marker", "attributed_events", "layers_table", "ops_table",
           "outside_evaluations", "primitive_ops", "profiler_events", "renumber", "steps_table", "with_module_type"]

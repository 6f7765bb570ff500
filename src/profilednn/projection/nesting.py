"""Which replayed ops ran inside another replayed item, so the step model counts them once.

The step model replays some calls whole: a PyTorch conv call (``aten::convolution``,
``aten::convolution_backward``) with everything it runs, and each framework op of a known
family (``vocabulary.op_family``) through its aten entry point. Some of those ops run *inside*
another replayed item: ``aten::relu_`` runs ``aten::clamp_min_``, ``aten::clone`` runs
``aten::copy_``, a conv backward runs ``aten::fill_``/``aten::copy_`` (``_slow_conv2d_*``,
layout copies). Replaying the outer call already times the inner one, so replaying the
inner op as well counts it twice (49 ``clamp_min_`` calls a step in resnet50, 89 in
RetinaNet). The Run's ``op_events`` table (one row per call, with its parent) says which
calls are nested; this module sums them per ``ops``-table key.
"""

from __future__ import annotations

import polars as pl

from ..vocabulary import CONV_ROOTS, op_family

OPS_KEY = ("op", "module", "phase", "input_shapes", "dtypes", "step")
NESTED_SCHEMA = {"op": pl.Utf8, "module": pl.Utf8, "phase": pl.Utf8, "input_shapes": pl.Utf8,
                 "dtypes": pl.Utf8, "step": pl.Int64, "inside": pl.Utf8, "container": pl.Utf8,
                 "container_shapes": pl.Utf8, "container_dtypes": pl.Utf8, "calls": pl.Int64,
                 "self_ms": pl.Float64}


def _replayed_whole(op: str) -> bool:
    return op in CONV_ROOTS or op_family(op) is not None


def nested_calls(events: pl.DataFrame) -> pl.DataFrame:
    """Replayable ops that ran inside another replayed item, per ``ops``-table key.

    ``events``: the Run's ``op_events`` (``event_id``, ``parent``, ``op``, ``self_ms`` and
    the ``ops`` key columns). For each call of a family op, its outermost ancestor that is
    replayed whole: ``inside`` = ``conv`` (a conv call: its time is in the call's inclusive
    time) or ``op`` (a family op, named by ``container``/``container_shapes``/
    ``container_dtypes``). Columns: the ops key (op, module, phase, input_shapes, dtypes,
    step), inside, container, container_shapes, container_dtypes, calls, self_ms. Empty
    when the Run has no op_events (a light capture): then nothing is taken out.
    """
    need = {"event_id", "parent", "op", "self_ms"}
    if events.is_empty() or not need <= set(events.columns):
        return pl.DataFrame(schema=NESTED_SCHEMA)
    ev = events.sort("event_id")
    ids = ev["event_id"].to_list()
    parents = ev["parent"].to_list()
    ops = ev["op"].to_list()
    shapes = ev["input_shapes"].to_list() if "input_shapes" in ev.columns else [None] * len(ids)
    dts = ev["dtypes"].to_list() if "dtypes" in ev.columns else [None] * len(ids)
    pos = {e: i for i, e in enumerate(ids)}
    # outer[i]: the outermost replayed-whole call among event i and its ancestors (or -1).
    # A parent precedes its children in event order (capture sorts by start, longest first).
    outer = [-1] * len(ids)
    container = [-1] * len(ids)
    for i, p in enumerate(parents):
        j = pos.get(p, -1) if p is not None and p >= 0 else -1
        up = outer[j] if 0 <= j < i else -1
        container[i] = up
        outer[i] = up if up >= 0 else (i if _replayed_whole(ops[i]) else -1)
    rows = [i for i in range(len(ids)) if container[i] >= 0 and op_family(ops[i]) is not None]
    if not rows:
        return pl.DataFrame(schema=NESTED_SCHEMA)
    c = [container[i] for i in rows]
    picked = ev[rows].with_columns(
        pl.Series("inside", ["conv" if ops[k] in CONV_ROOTS else "op" for k in c], dtype=pl.Utf8),
        pl.Series("container", [ops[k] for k in c], dtype=pl.Utf8),
        pl.Series("container_shapes", [shapes[k] for k in c], dtype=pl.Utf8),
        pl.Series("container_dtypes", [dts[k] for k in c], dtype=pl.Utf8))
    for col, dt in NESTED_SCHEMA.items():
        if col not in picked.columns:
            picked = picked.with_columns(pl.lit(None, dt).alias(col))
    keys = [*OPS_KEY, "inside", "container", "container_shapes", "container_dtypes"]
    return (picked.group_by(keys).agg(pl.len().cast(pl.Int64).alias("calls"),
                                      pl.col("self_ms").sum().alias("self_ms"))
            .select(*NESTED_SCHEMA).cast(NESTED_SCHEMA))


def taken_out(nested: pl.DataFrame, otab: pl.DataFrame) -> pl.DataFrame:
    """Per ops key: what the ``native kernels`` part must not count again.

    ``conv_calls``/``conv_ms``: calls (and their self time) inside a conv call, which the
    conv call's inclusive time and its whole replay already hold. ``covered_calls``: calls
    inside a family op whose replay succeeded (``otab`` has its ``replay_ms``): their
    in-situ self time stays in the part, their replay is the container's.
    """
    schema = {**{k: NESTED_SCHEMA[k] for k in OPS_KEY}, "conv_calls": pl.Int64,
              "conv_ms": pl.Float64, "covered_calls": pl.Int64}
    if nested.is_empty():
        return pl.DataFrame(schema=schema)
    n = nested
    if not otab.is_empty() and "replay_ms" in otab.columns:
        replayed = (otab.filter(pl.col("replay_ms").is_not_null())
                    .select(pl.col("op").alias("container"),
                            pl.col("input_shapes").alias("container_shapes"),
                            pl.col("dtypes").alias("container_dtypes"))
                    .unique().with_columns(pl.lit(True).alias("_replayed")))
        n = n.join(replayed, on=["container", "container_shapes", "container_dtypes"],
                   how="left", nulls_equal=True)
    else:
        n = n.with_columns(pl.lit(None, pl.Boolean).alias("_replayed"))
    conv = pl.col("inside") == "conv"
    covered = (pl.col("inside") == "op") & pl.col("_replayed").fill_null(False)
    return (n.group_by(list(OPS_KEY)).agg(
        pl.col("calls").filter(conv).sum().cast(pl.Int64).alias("conv_calls"),
        pl.col("self_ms").filter(conv).sum().alias("conv_ms"),
        pl.col("calls").filter(covered).sum().cast(pl.Int64).alias("covered_calls"))
        .select(*schema).cast(schema))


def per_unique_op(out: pl.DataFrame, steps: int) -> pl.DataFrame:
    """``taken_out`` per unique op (op, input_shapes, dtypes), per step, for the op table.

    Columns: op, input_shapes, dtypes, nested_calls_per_step (calls inside a conv call or
    covered by a replayed container), conv_ms_per_step (self time inside conv calls).
    """
    schema = {"op": pl.Utf8, "input_shapes": pl.Utf8, "dtypes": pl.Utf8,
              "nested_calls_per_step": pl.Float64, "conv_ms_per_step": pl.Float64}
    if out.is_empty():
        return pl.DataFrame(schema=schema)
    n = max(steps, 1)
    return (out.group_by("op", "input_shapes", "dtypes").agg(
        ((pl.col("conv_calls") + pl.col("covered_calls")).sum() / n).alias("nested_calls_per_step"),
        (pl.col("conv_ms").sum() / n).alias("conv_ms_per_step"))
        .select(*schema).cast(schema))


__all__ = ["NESTED_SCHEMA", "OPS_KEY", "nested_calls", "per_unique_op", "taken_out"]

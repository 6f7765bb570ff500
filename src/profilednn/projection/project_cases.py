"""The projection's first stage: what to replay.

From a Run's tables: the oneDNN primitives executed in a step, the framework ops that are
compute kernels outside oneDNN, one replay case per unique primitive and per unique op,
and (for the step model) one case per PyTorch conv call. ``in_dtype`` turns the conv and
GEMM cases into a dtype what-if.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from ..errors import InputError, NoPrimitivesError
from ..run import Run
from ..tables import OPS, PRIMITIVES
from ..hardware.roofline import op_flops_bytes
from ..vocabulary import ONEDNN_DTYPE, PROFILER_DTYPE, op_dtype, op_family
from .cases import op_case, parse_shapes, primitive_case, unique_primitives
from .step_model import conv_calls

POOL_BACKWARD = "aten::max_pool2d_with_indices_backward"  # its shapes give the pooling windows


@dataclass
class ProjectionCases:
    """A Run's rows to project and the replay cases made from them."""

    prims: pl.DataFrame  # exec primitives on the CPU, inside a step
    ops: pl.DataFrame  # framework-op rows replayable outside oneDNN, with their family
    unique: pl.DataFrame  # one row per unique primitive, with ``case_id`` and ``note``
    prim_cases: list[dict[str, Any]]
    uops: pl.DataFrame  # one row per unique (op, shapes, dtypes), with FLOPs, bytes and note
    op_cases: list[dict[str, Any]]
    all_ops: pl.DataFrame  # the whole ops table (the step model's input; empty without it)
    conv_cases: list[dict[str, Any]]  # one per PyTorch conv call (step_model.conv_calls)
    calls: pl.DataFrame  # those conv calls

    @property
    def every_case(self) -> list[dict[str, Any]]:
        return self.prim_cases + self.op_cases + self.conv_cases


def exec_primitives(run: Run) -> pl.DataFrame:
    """The Run's primitive rows that executed on the CPU inside a measured step."""
    if not run.has_table(PRIMITIVES):
        return pl.DataFrame()
    p = run.table(PRIMITIVES)
    if p.is_empty():
        return p
    if "event" in p.columns:
        p = p.filter(pl.col("event") == "exec")
    if "engine" in p.columns:
        p = p.filter(pl.col("engine").fill_null("cpu") == "cpu")
    if "step" in p.columns and p["step"].is_not_null().any():
        p = p.filter(pl.col("step").is_not_null())
    return p


def replayable_ops(run: Run) -> pl.DataFrame:
    """Framework-op rows that are compute kernels outside oneDNN (one per module/phase/step)."""
    if not run.has_table(OPS):
        return pl.DataFrame()
    ops = run.table(OPS)
    if ops.is_empty():
        return ops
    fam = [op_family(o) for o in ops["op"].to_list()]
    ops = ops.with_columns(pl.Series("family", fam, dtype=pl.Utf8))
    keep = pl.col("family").is_not_null()
    if "onednn_ms" in ops.columns:
        keep = keep & (pl.col("onednn_ms").fill_null(0.0) <= 0.0)
    return ops.filter(keep)


def replay_inputs(run: Run, replay_ops: bool) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The primitives and (with ``replay_ops``) the framework ops to project; a Run with
    neither has nothing to project."""
    prims = exec_primitives(run)
    ops = replayable_ops(run) if replay_ops else pl.DataFrame()
    if prims.is_empty() and ops.is_empty():
        raise NoPrimitivesError(
            f"Run {run.path} has no oneDNN primitive and no framework op to replay "
            "(profile it without --light, with oneDNN enabled)")
    return prims, ops


def gather_cases(run: Run, prims: pl.DataFrame, ops: pl.DataFrame, *, step_model: bool,
                 replay_dtype: str | None) -> ProjectionCases:
    """Every replay case of the projection (conv calls only with ``step_model``), in
    ``replay_dtype`` where given."""
    unique = unique_primitives(prims) if not prims.is_empty() else pl.DataFrame()
    pcases, unique = _prim_cases(unique) if not unique.is_empty() else ([], unique)
    ocases, uops = _unique_ops(ops)
    all_ops = run.table(OPS) if step_model and run.has_table(OPS) else pl.DataFrame()
    ccases, calls = conv_calls(all_ops, prims) if step_model else ([], pl.DataFrame())
    if replay_dtype:
        in_dtype(replay_dtype, ccases, ocases, uops)
    return ProjectionCases(prims, ops, unique, pcases, uops, ocases, all_ops, ccases, calls)


def _prim_cases(unique: pl.DataFrame) -> tuple[list[dict], pl.DataFrame]:
    cases, notes = [], []
    for row in unique.iter_rows(named=True):
        case, why = primitive_case(row)
        notes.append(why)
        if case is not None:
            case["id"] = row["case_id"]
            cases.append(case)
    return cases, unique.with_columns(pl.Series("note", notes, dtype=pl.Utf8))


def _pool_windows(ops: pl.DataFrame) -> dict[str | None, list[int]]:
    """Per module: the pooling output's height and width, read from its backward's shapes."""
    out_hw: dict[str | None, list[int]] = {}
    for r in ops.filter(pl.col("op") == POOL_BACKWARD).iter_rows(named=True):
        shapes = parse_shapes(r["input_shapes"])
        if shapes and isinstance(shapes[0], list) and len(shapes[0]) == 4:
            out_hw[r["module"]] = shapes[0][2:]
    return out_hw


def _unique_ops(ops: pl.DataFrame) -> tuple[list[dict], pl.DataFrame]:
    """One case per (op, shapes, dtypes); pooling windows inferred from backward shapes."""
    if ops.is_empty():
        return [], pl.DataFrame()
    out_hw = _pool_windows(ops)
    uniq = (ops.group_by("op", "input_shapes", "dtypes", maintain_order=True)
            .agg(pl.col("family").first(), pl.col("calls").sum(),
                 pl.col("self_time_ms").sum().alias("in_situ_total_ms"),
                 pl.col("module").first())
            .with_row_index("oid").with_columns(pl.format("o{}", pl.col("oid")).alias("case_id"))
            .drop("oid"))
    cases, notes, flops, nbytes, dts = [], [], [], [], []
    for r in uniq.iter_rows(named=True):
        shapes = parse_shapes(r["input_shapes"])
        dtypes = parse_shapes(r["dtypes"])
        case, note = op_case(r["op"], shapes, dtypes, None, out_hw.get(r["module"]))
        if case is not None:
            case["id"] = r["case_id"]
            case["evict"] = True  # timed cold, as in a step (worker.py, step_model.py)
            cases.append(case)
        notes.append(note)
        f, b = op_flops_bytes(r["op"], shapes, dtypes) if shapes else (0.0, 0.0)
        flops.append(f)
        nbytes.append(b)
        dts.append(op_dtype(dtypes))
    uniq = uniq.drop("module").with_columns(
        pl.Series("note", notes, dtype=pl.Utf8), pl.Series("flops", flops, dtype=pl.Float64),
        pl.Series("bytes", nbytes, dtype=pl.Float64), pl.Series("dtype", dts, dtype=pl.Utf8),
        (pl.col("in_situ_total_ms") / pl.col("calls")).alias("in_situ_ms"))
    return cases, uniq


def in_dtype(dtype: str, conv_cases: list[dict], op_cases: list[dict], uops: pl.DataFrame) -> None:
    """Conv call cases and GEMM op cases (fp32 ones) set to replay in ``dtype``, as autocast
    would run them: the conv's input, weight and output gradient, a GEMM's operands."""
    cfg = ONEDNN_DTYPE.get(dtype)  # "bf16" -> oneDNN's "bf16"
    if cfg is None or cfg == "f32":
        raise InputError(f"cannot replay in {dtype!r}: bf16 or fp16")
    aten = PROFILER_DTYPE[dtype]  # and the profiler's "c10::BFloat16"
    for case in conv_cases:
        if case.get("dtype", "f32") == "f32":
            case["dtype"] = cfg
    gemm = set(uops.filter(pl.col("family") == "gemm")["case_id"].to_list()) if not uops.is_empty() else set()
    for case in op_cases:
        if case["id"] in gemm:
            case["dtypes"] = [aten if d == "float" else d for d in case["dtypes"]]


__all__ = ["ProjectionCases", "exec_primitives", "gather_cases", "in_dtype", "replay_inputs", "replayable_ops"]

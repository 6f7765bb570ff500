"""Predict the whole step, not only its kernels: ``projected_step_ms`` and its parts.

A measured step (mean over the Run's steps, per phase) splits into parts the Run can see:

- ``conv calls``: PyTorch's convolution calls (``aten::convolution`` and
  ``aten::convolution_backward``, inclusive of all they run). Replayed *whole* at the
  target, so PyTorch picks its path there by its own rule: oneDNN, or a native ATen kernel
  (``_slow_conv2d_*`` for 1x1 stride-1 convolutions at 1 thread and batch < 16, see
  ``ConvParams::use_mkldnn`` in ATen's Convolution.cpp). Which path ran is recorded.
- ``oneDNN (other)``: oneDNN primitives outside convolutions (replayed alone).
- ``native kernels``: ATen compute ops outside oneDNN (replayed alone, cold; at another
  thread count scaled by their family's in-situ/replay ratio at the Run's own, see
  ``native_calibration``).
- ``other ops``: the rest of the ops' self time: dispatch, allocation, autograd
  bookkeeping and ops ProfileDNN does not replay; measured per op call, kept as is.
- ``Python & gaps``: the phase's time not covered by any op (Python, hooks, the time
  between ops); kept as is.

projected part = replayed time at the target for the three kernel parts, measured time
for the other two; ``projected_step_ms`` is their sum over all phases. Items not replayed
count at their in-situ time.

The conv calls' replay cases are ``conv_calls.py``'s and the native kernels' calibration
``calibration.py``'s; this module adds the parts up (their names are re-exported here).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from ..tables import PHASES
from ..vocabulary import is_native_conv, op_family
from .calibration import CALIBRATION_BOUNDS, calibrate_ops, native_calibration
from .cases import PRIM_KEY
from .conv_calls import attach_conv_replay, call_case_ids, conv_calls, conv_geometry, target_path
from .nesting import CONV_ROOTS, OPS_KEY, taken_out

OUTSIDE = "(outside phases)"
# The step's parts (the step model table's ``part``), each named once.
CONV_CALLS = "conv calls"
ONEDNN_OTHER = "oneDNN (other)"
NATIVE_KERNELS = "native kernels"
OTHER_OPS = "other ops"
PYTHON_GAPS = "Python & gaps"
KERNEL_PARTS = (CONV_CALLS, ONEDNN_OTHER, NATIVE_KERNELS)
STEP_PARTS = (*KERNEL_PARTS, OTHER_OPS, PYTHON_GAPS)
"""Every part, in the order the tables list them: the replayed kernels, then what is kept as measured."""
PART_ASSUMPTIONS = {
    CONV_CALLS: "PyTorch's conv call (fwd/bwd, with its reorders) replayed whole and cold "
                "at the target's threads; PyTorch picks oneDNN or a native kernel there itself",
    ONEDNN_OTHER: "oneDNN primitives outside convolutions: oneDNN's own time in the replay",
    NATIVE_KERNELS: "ATen compute ops outside oneDNN: wall time of the op replayed alone "
                    "with cold caches; at another thread count, times the family's "
                    "in-situ/replay ratio measured at the Run's own",
    OTHER_OPS: "dispatch, allocation, autograd and unreplayed ops: single-threaded, "
               "kept as measured per op call",
    PYTHON_GAPS: "time between ops (Python, hooks, the profiler): kept as measured",
}


# --------------------------------------------------------------------------- the step
def _phase(col: str = "phase") -> pl.Expr:
    return pl.col(col).fill_null(OUTSIDE)


def _without_nested(nat: pl.DataFrame, nested: pl.DataFrame | None,
                    otab: pl.DataFrame) -> pl.DataFrame:
    """Native-kernel rows with what another replayed item already holds taken out.

    Adds own_ms (self time outside conv calls), own_calls, and alone_calls (the calls whose
    replay is not already inside a conv call's or a family op's replay; ``nesting.py``).
    """
    keys = [k for k in OPS_KEY if k in nat.columns]
    if nested is not None and not nested.is_empty() and keys:
        out = taken_out(nested, otab).select(*keys, "conv_calls", "conv_ms", "covered_calls")
        out = out.group_by(keys).agg(pl.col("conv_calls").sum(), pl.col("conv_ms").sum(),
                                     pl.col("covered_calls").sum())
        nat = nat.join(out, on=keys, how="left", nulls_equal=True)
    else:
        nat = nat.with_columns(pl.lit(0, pl.Int64).alias("conv_calls"),
                               pl.lit(0.0).alias("conv_ms"), pl.lit(0, pl.Int64).alias("covered_calls"))
    conv_calls_ = pl.col("conv_calls").fill_null(0)
    return nat.with_columns(
        (pl.col("self_time_ms") - pl.col("conv_ms").fill_null(0.0)).clip(lower_bound=0.0).alias("own_ms"),
        (pl.col("calls") - conv_calls_).clip(lower_bound=0).alias("own_calls"),
        (pl.col("calls") - conv_calls_ - pl.col("covered_calls").fill_null(0))
        .clip(lower_bound=0).alias("alone_calls"))


class _PartTable:
    """The step model's rows, (phase, part) -> mean ms per step in situ and projected, calls."""

    def __init__(self, steps: int) -> None:
        self.n = max(steps, 1)
        self.rows: dict[tuple[str, str], dict[str, float]] = {}

    def add(self, phase: str, part: str, in_situ: float, projected: float, calls: float = 0.0) -> None:
        r = self.rows.setdefault((phase, part), {"in_situ_ms": 0.0, "projected_ms": 0.0, "calls": 0.0})
        r["in_situ_ms"] += in_situ / self.n
        r["projected_ms"] += projected / self.n
        r["calls"] += calls / self.n

    def in_situ_per_step(self) -> float:
        return sum(v["in_situ_ms"] for v in self.rows.values())

    def frame(self) -> pl.DataFrame:
        out = pl.DataFrame([{"phase": ph, "part": part, **v} for (ph, part), v in self.rows.items()],
                           schema={"phase": pl.Utf8, "part": pl.Utf8, "in_situ_ms": pl.Float64,
                                   "projected_ms": pl.Float64, "calls": pl.Float64})
        order = {p: i for i, p in enumerate((*PHASES, OUTSIDE))}
        parts = {p: i for i, p in enumerate(STEP_PARTS)}
        return (out.filter((pl.col("in_situ_ms") != 0) | (pl.col("projected_ms") != 0))
                .with_columns(pl.col("part").replace_strict(PART_ASSUMPTIONS, default=None)
                              .alias("assumption"))
                .sort(pl.col("phase").replace_strict(order, default=99, return_dtype=pl.Int64),
                      pl.col("part").replace_strict(parts, default=99, return_dtype=pl.Int64)))


def _measured_phases(steps: pl.DataFrame) -> tuple[dict[str, float], float]:
    """Measured ms per phase over all steps (OUTSIDE: the step not in any phase) and the total."""
    measured = {ph: float(steps[f"{ph}_ms"].fill_null(0.0).sum()) for ph in PHASES
                if f"{ph}_ms" in steps.columns}
    total = float(steps["time_ms"].fill_null(0.0).sum()) if "time_ms" in steps.columns else 0.0
    measured[OUTSIDE] = max(0.0, total - sum(measured.values()))
    return measured, total


def _conv_call_part(o: pl.DataFrame, calls: pl.DataFrame, table: _PartTable) -> dict[str, float]:
    """Conv calls: the roots' inclusive time, projected per unique call. In-situ ms per phase."""
    kernel_in: dict[str, float] = {}
    if calls.is_empty():
        return kernel_in
    per = call_case_ids(calls).join(calls.select("case_id", "replay_ms", "in_situ_ms"), on="case_id", how="left")
    keys = [k for k in ("op", "module", "input_shapes", "dtypes") if k in per.columns]
    r = o.filter(pl.col("op").is_in(list(CONV_ROOTS))).join(per.drop("case_id"), on=keys, how="left",
                                                            nulls_equal=True)
    for ph, ins, proj, c in r.group_by("ph").agg(
            pl.col("total_time_ms").sum().alias("a"),
            (pl.col("calls") * pl.coalesce(pl.col("replay_ms"), pl.col("total_time_ms")
                                           / pl.col("calls"))).sum().alias("b"),
            pl.col("calls").sum().alias("c")).iter_rows():
        table.add(ph, CONV_CALLS, ins, proj, c)
        kernel_in[ph] = kernel_in.get(ph, 0.0) + ins
    return kernel_in


def _native_part(o: pl.DataFrame, otab: pl.DataFrame, nested: pl.DataFrame | None,
                 table: _PartTable) -> tuple[dict[str, float], dict[str, float]]:
    """Native kernels replayed alone. In-situ ms and calls per phase."""
    kernel_in: dict[str, float] = {}
    kernel_calls: dict[str, float] = {}
    fam = o.with_columns(pl.col("op").map_elements(op_family, return_dtype=pl.Utf8).alias("fam"))
    nat = fam.filter(pl.col("fam").is_not_null() & (pl.col("onednn_ms").fill_null(0.0) <= 0.0)
                     if "onednn_ms" in fam.columns else pl.col("fam").is_not_null())
    if nat.is_empty():
        return kernel_in, kernel_calls
    if not otab.is_empty():
        per = otab.select("op", "input_shapes", "dtypes",
                          pl.coalesce("calibrated_ms", "replay_ms").alias("replay_ms")
                          if "calibrated_ms" in otab.columns else "replay_ms")
        nat = nat.join(per, on=["op", "input_shapes", "dtypes"], how="left", nulls_equal=True)
    else:
        nat = nat.with_columns(pl.lit(None, pl.Float64).alias("replay_ms"))
    nat = _without_nested(nat, nested, otab)
    for ph, ins, proj, c in nat.group_by("ph").agg(
            pl.col("own_ms").sum().alias("a"),
            pl.coalesce(pl.col("alone_calls") * pl.col("replay_ms"), pl.col("own_ms")).sum().alias("b"),
            pl.col("own_calls").sum().alias("c")).iter_rows():
        table.add(ph, NATIVE_KERNELS, ins, proj, c)
        kernel_in[ph] = kernel_in.get(ph, 0.0) + ins
        kernel_calls[ph] = kernel_calls.get(ph, 0.0) + c
    return kernel_in, kernel_calls


def _onednn_part(prims: pl.DataFrame, ptab: pl.DataFrame, table: _PartTable) -> dict[str, float]:
    """oneDNN primitives outside convolutions. In-situ ms per phase."""
    kernel_in: dict[str, float] = {}
    if prims.is_empty():
        return kernel_in
    p = prims.with_columns(_phase().alias("ph"))
    if "op" in p.columns:
        p = p.filter(~pl.col("op").fill_null("").str.contains("conv"))
    if p.is_empty() or ptab.is_empty():
        return kernel_in
    keys = [k for k in PRIM_KEY if k in p.columns and k in ptab.columns]
    p = p.join(ptab.select(*keys, "replay_ms"), on=keys, how="left", nulls_equal=True)
    for ph, ins, proj, c in p.group_by("ph").agg(
            pl.col("time_ms").sum().alias("a"),
            pl.coalesce("replay_ms", "time_ms").sum().alias("b"),
            pl.len().alias("c")).iter_rows():
        table.add(ph, ONEDNN_OTHER, ins, proj, c)
        kernel_in[ph] = kernel_in.get(ph, 0.0) + ins
    return kernel_in


def step_parts(steps: pl.DataFrame, ops: pl.DataFrame, prims: pl.DataFrame,
               ptab: pl.DataFrame, otab: pl.DataFrame, calls: pl.DataFrame,
               nested: pl.DataFrame | None = None) -> pl.DataFrame:
    """The step model: one row per (phase, part), mean ms per step, in situ and projected.

    ``ptab``/``otab``/``calls`` are the projection's primitive, op and conv-call tables
    (``replay_ms`` per item); ``prims`` the Run's exec primitives, ``ops`` its op table;
    ``nested``: ``nesting.nested_calls`` of the Run's op events (family ops inside conv
    calls or inside other family ops are then counted once; None: not known).
    """
    table = _PartTable(steps.height)
    measured, total = _measured_phases(steps)
    covered = {ph: 0.0 for ph in measured}
    kernel_in: dict[str, float] = {}
    kernel_calls: dict[str, float] = {}
    other_calls: dict[str, float] = {}
    if not ops.is_empty():
        o = ops.with_columns(_phase().alias("ph"))
        for ph, ms in o.group_by("ph").agg(pl.col("self_time_ms").sum()).iter_rows():
            covered[ph] = float(ms or 0.0)
            measured.setdefault(ph, covered[ph])
        conv_in = _conv_call_part(o, calls, table)
        native_in, kernel_calls = _native_part(o, otab, nested, table)
        kernel_in = {ph: conv_in.get(ph, 0.0) + native_in.get(ph, 0.0) for ph in {*conv_in, *native_in}}
        # other ops: everything else the ops cover (dispatch, allocation, unreplayed ops)
        other_calls = {ph: float(c) for ph, c in o.filter(
            ~pl.col("op").is_in(list(CONV_ROOTS)) & ~pl.col("op").str.contains("conv"))
            .group_by("ph").agg(pl.col("calls").sum()).iter_rows()}
    for ph, ins in _onednn_part(prims, ptab, table).items():
        if ops.is_empty():
            covered[ph] = covered.get(ph, 0.0) + ins
            measured.setdefault(ph, ins)
        kernel_in[ph] = kernel_in.get(ph, 0.0) + ins
    for ph, t in measured.items():
        other = max(0.0, covered.get(ph, 0.0) - kernel_in.get(ph, 0.0))
        table.add(ph, OTHER_OPS, other, other, max(0.0, other_calls.get(ph, 0.0) - kernel_calls.get(ph, 0.0)))
        if ph != OUTSIDE:
            gaps = max(0.0, t - covered.get(ph, 0.0))
            table.add(ph, PYTHON_GAPS, gaps, gaps)
    # Outside the phases: the rest of the step, so the parts add up to the measured step
    # exactly (ops that start in one phase and end in the next make this slightly smaller).
    if total:
        rest = total / table.n - table.in_situ_per_step()
        table.add(OUTSIDE, PYTHON_GAPS, rest * table.n, rest * table.n)
    return table.frame()


def by_part(parts: pl.DataFrame) -> pl.DataFrame:
    """The step model summed over phases: one row per part (with µs per call of ``other ops``)."""
    if parts.is_empty():
        return parts
    order = {p: i for i, p in enumerate(STEP_PARTS)}
    return (parts.group_by("part").agg(pl.col("in_situ_ms").sum(), pl.col("projected_ms").sum(),
                                       pl.col("calls").sum(), pl.col("assumption").first())
            .with_columns((1e3 * pl.col("in_situ_ms") / pl.col("calls")).alias("us_per_call"))
            .sort(pl.col("part").replace_strict(order, default=99, return_dtype=pl.Int64)))


def by_phase(parts: pl.DataFrame) -> pl.DataFrame:
    """The step model summed over parts: one row per phase."""
    if parts.is_empty():
        return parts
    order = {p: i for i, p in enumerate((*PHASES, OUTSIDE))}
    return (parts.group_by("phase").agg(pl.col("in_situ_ms").sum(), pl.col("projected_ms").sum())
            .sort(pl.col("phase").replace_strict(order, default=99, return_dtype=pl.Int64)))


def step_summary(parts: pl.DataFrame, calls: pl.DataFrame) -> dict[str, Any]:
    """Totals: modeled (= measured mean) and projected step, kernel/non-kernel split, path switches."""
    if parts.is_empty():
        return {"projected_step_ms": None}
    kern = parts.filter(pl.col("part").is_in(list(KERNEL_PARTS)))
    switched = 0
    native_in = native_proj = 0.0
    if not calls.is_empty() and "replay_path" in calls.columns:
        c = calls.with_columns(
            pl.col("in_situ_path").map_elements(is_native_conv, return_dtype=pl.Boolean).alias("n0"),
            pl.coalesce("replay_path", "in_situ_path")  # not replayed: the in-situ path stays
            .map_elements(is_native_conv, return_dtype=pl.Boolean).alias("n1"))
        switched = int(c.filter(pl.col("replay_path").is_not_null()
                                & (pl.col("n0") != pl.col("n1"))).height)
        native_in = float(c.filter(pl.col("n0"))["in_situ_total_ms"].sum() or 0.0)
        native_proj = float(c.filter(pl.col("n1"))["projected_ms"].sum() or 0.0)
    return {
        "projected_step_ms": float(parts["projected_ms"].sum()),
        "modeled_step_ms": float(parts["in_situ_ms"].sum()),
        "step_kernel_in_situ_ms": float(kern["in_situ_ms"].sum()),
        "step_kernel_projected_ms": float(kern["projected_ms"].sum()),
        "step_non_kernel_ms": float(parts.filter(~pl.col("part").is_in(list(KERNEL_PARTS)))
                                    ["projected_ms"].sum()),
        "native_conv_in_situ_ms": native_in,
        "native_conv_projected_ms": native_proj,
        "conv_calls_switching_path": switched,
    }


def whatif_step(parts: pl.DataFrame, factors: dict[str, float]) -> float | None:
    """A what-if's step: kernel parts times the what-if's factor for them, the rest as is.

    ``factors``: part -> (what-if time / in-situ time) of the items behind that part.
    """
    if parts.is_empty():
        return None
    total = 0.0
    for part, proj in parts.select("part", "projected_ms").iter_rows():
        total += float(proj) * factors.get(part, 1.0)
    return total


__all__ = ["CALIBRATION_BOUNDS", "CONV_ROOTS", "KERNEL_PARTS", "attach_conv_replay", "by_part", "by_phase",
           "calibrate_ops", "call_case_ids", "conv_calls", "conv_geometry",
           "native_calibration", "step_parts", "step_summary", "target_path", "whatif_step"]

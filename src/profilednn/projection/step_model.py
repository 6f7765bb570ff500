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
"""

from __future__ import annotations

from typing import Any

import polars as pl

from ..tables import PHASES
from ..vocabulary import (
    CHANNELS_LAST_TAGS, CONV_BACKWARD_OP, CONV_FORWARD_OP, ONEDNN_DTYPE, is_native_conv, op_dtype, op_family,
)
from .cases import PRIM_KEY, conv_case, parse_shapes
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


def conv_geometry(in_hw: list[int], out_hw: list[int], k: list[int]
                  ) -> tuple[list[int], list[int]] | None:
    """(stride, padding) giving ``out_hw`` from ``in_hw`` with kernel ``k`` (dilation 1).

    Symmetric padding; the usual ``(k - 1) // 2`` is tried first, then 0, then the rest.
    """
    strides, pads = [], []
    for i, o, kk in zip(in_hw, out_hw, k):
        found = None
        for p in dict.fromkeys([(kk - 1) // 2, 0, *range(kk)]):
            for s in range(1, 9):
                if (i + 2 * p - kk) // s + 1 == o:
                    found = (s, p)
                    break
            if found:
                break
        if found is None:
            return None
        strides.append(found[0])
        pads.append(found[1])
    return strides, pads


def _module_facts(roots: pl.DataFrame, prims: pl.DataFrame) -> dict[str | None, dict]:
    """Per conv module: forward bias, output size (from its backward), channels-last."""
    facts: dict[str | None, dict] = {}
    for r in roots.iter_rows(named=True):
        shapes, dts = parse_shapes(r["input_shapes"]), parse_shapes(r["dtypes"])
        f = facts.setdefault(r["module"], {})
        if r["op"] == CONV_FORWARD_OP and len(dts) > 2 and len(shapes) > 2:
            f["bias"] = bool(dts[2]) and bool(shapes[2])
        elif r["op"] == CONV_BACKWARD_OP and len(shapes) > 1 and \
                isinstance(shapes[0], list) and len(shapes[0]) == 4:
            f.setdefault("out", {})[str(shapes[1])] = shapes[0][2:]
    if not prims.is_empty() and {"driver", "module", "src_tag"} <= set(prims.columns):
        cl = prims.filter((pl.col("driver") == "conv") & pl.col("src_tag").is_in(list(CHANNELS_LAST_TAGS)))
        for m in cl["module"].unique().to_list():
            facts.setdefault(m, {})["channels_last"] = True
        # stride, dilation and padding as oneDNN decoded them (the conv's own primitive)
        conv = prims.filter((pl.col("driver") == "conv") & pl.col("module").is_not_null())
        for row in conv.unique(subset=["module"], keep="first", maintain_order=True) \
                .iter_rows(named=True):
            case, _ = conv_case(row)
            if case is not None and not case["transposed"]:
                facts.setdefault(row["module"], {})["geometry"] = {
                    "in": case["in"], "k": case["k"], "s": case["s"], "d": case["d"],
                    "p": case["p"]}
        # which gradients its backward computed: BWD_D only where the input needs one
        if "direction" in conv.columns:
            bwd = conv.filter(pl.col("direction").fill_null("").str.starts_with("BWD"))
            for m, dirs in bwd.group_by("module").agg(pl.col("direction").unique()).iter_rows():
                facts.setdefault(m, {})["backward"] = set(dirs)
    return facts


def _geometry_from_primitive(geo: dict | None, x_hw: list[int], out_hw: list[int],
                             k: list[int]) -> tuple[list[int], list[int], list[int]] | None:
    """(stride, padding, dilation) of the module's oneDNN primitive, if it gives ``out_hw``."""
    if not geo or geo["k"] != k:
        return None
    for i, o, kk, s, d, p in zip(x_hw, out_hw, k, geo["s"], geo["d"], geo["p"]):
        if (i + 2 * p - d * (kk - 1) - 1) // s + 1 != o:
            return None
    return geo["s"], geo["p"], geo["d"]


def _out_from_primitive(geo: dict | None, x_hw: list[int], k: list[int]) -> list[int] | None:
    """The output size of ``x_hw`` under the module's oneDNN stride/padding/dilation.

    The module's stride, padding and dilation hold at any input size (RetinaNet's head
    convs run at five); used where no backward call recorded the output size.
    """
    if not geo or geo["k"] != k:
        return None
    out = [(i + 2 * p - d * (kk - 1) - 1) // s + 1
           for i, kk, s, d, p in zip(x_hw, k, geo["s"], geo["d"], geo["p"])]
    return out if all(o > 0 for o in out) else None


def _call_case(r: dict, facts: dict) -> tuple[dict | None, str | None]:
    """The replay case of one conv root call (kind ``conv`` of the worker), or why not."""
    shapes, dts = parse_shapes(r["input_shapes"]), parse_shapes(r["dtypes"])
    fwd = r["op"] == CONV_FORWARD_OP
    at = (lambda i: shapes[i] if len(shapes) > i else None)
    x, w = (at(0), at(1)) if fwd else (at(1), at(2))
    if not (isinstance(x, list) and isinstance(w, list) and len(x) == 4 and len(w) == 4):
        return None, "only 2-d convolutions with recorded shapes are replayed whole"
    if x[1] % w[1]:
        return None, "transposed convolution: kept at its in-situ time"
    g, k = x[1] // w[1], w[2:]
    f = facts.get(r["module"], {})
    notes = []
    if fwd:
        out = (f.get("out") or {}).get(str(x))
        bias = bool(f.get("bias"))
    else:
        out = shapes[0][2:] if isinstance(shapes[0], list) and len(shapes[0]) == 4 else None
        bias = bool(f.get("bias"))
    if out is None:  # no backward call (a frozen layer): the module's own primitive says
        out = _out_from_primitive(f.get("geometry"), x[2:], k)
    if out is None:
        out = [(i + 2 * ((kk - 1) // 2) - kk) + 1 for i, kk in zip(x[2:], k)]
        notes.append("output size not recorded: stride 1 and same padding assumed")
    known = _geometry_from_primitive(f.get("geometry"), x[2:], out, k)
    if known is not None:
        s, p, d = known
    else:
        geo = conv_geometry(x[2:], out, k)
        if geo is None:
            return None, f"no stride/padding gives {out} from {x[2:]} with kernel {k}"
        (s, p), d = geo, [1] * len(k)
        notes.append("no oneDNN primitive of this conv: dilation 1 and the smallest stride "
                     "that fits assumed")
    dtype = ONEDNN_DTYPE[op_dtype(dts[:1])]
    if fwd:
        direction = "FWD_B" if bias else "FWD_D"
    else:
        done = f.get("backward")  # the module's oneDNN backward primitives, if any
        if done:  # e.g. the first layer after frozen ones computes the weight gradient only
            grad_input = "BWD_D" in done
        else:
            grad_input = x[1] > 4  # the model's input layer (C <= 4) needs no input gradient
            if not grad_input:
                notes.append("input gradient assumed not needed (C <= 4: the model's input layer)")
        direction = {(True, False): "BWD_DW", (True, True): "BWD_DWB",
                     (False, False): "BWD_W", (False, True): "BWD_WB"}[(grad_input, bias)]
    case = {"kind": "conv", "transposed": False, "direction": direction, "mb": x[0], "g": g,
            "ic": x[1], "oc": w[0], "in": x[2:], "out": out, "k": k, "s": s, "d": d, "p": p,
            "output_padding": [0, 0], "bias": bias, "dtype": dtype,
            "channels_last": bool(f.get("channels_last")), "profile_ops": True, "evict": True}
    return case, "; ".join(notes) or None


def conv_calls(ops: pl.DataFrame, prims: pl.DataFrame) -> tuple[list[dict], pl.DataFrame]:
    """Replay cases for the Run's conv calls, and one row per unique call.

    Columns: op, input_shapes, dtypes, case_id, calls, in_situ_total_ms (inclusive, all
    steps), in_situ_path (``oneDNN`` or the native kernel that ran), note, modules (the
    modules whose calls of this op, shapes and dtypes are this case). Two calls with the
    same op, shapes and dtypes can be different cases (RetinaNet's P7 conv has the head
    convs' shapes with stride 2), so a call is found by its module too (``call_case_ids``).
    """
    empty = pl.DataFrame(schema={"op": pl.Utf8, "input_shapes": pl.Utf8, "dtypes": pl.Utf8,
                                 "case_id": pl.Utf8, "calls": pl.Int64,
                                 "in_situ_total_ms": pl.Float64, "in_situ_path": pl.Utf8,
                                 "note": pl.Utf8, "modules": pl.List(pl.Utf8)})
    if ops.is_empty() or "total_time_ms" not in ops.columns:
        return [], empty
    roots = ops.filter(pl.col("op").is_in(list(CONV_ROOTS)))
    if roots.is_empty():
        return [], empty
    facts = _module_facts(roots, prims)
    native = ops.filter(pl.col("op").map_elements(is_native_conv, return_dtype=pl.Boolean))
    native_at = {(m, ph): op for m, ph, op in native.select("module", "phase", "op")
                 .sort(pl.col("op").str.contains("slow")).iter_rows()}  # the slow_* kernel wins
    by_key: dict[str, dict] = {}
    cases: list[dict] = []
    for r in roots.iter_rows(named=True):
        case, note = _call_case(r, facts)
        key = repr(sorted(case.items())) if case else f"{r['op']}|{r['input_shapes']}|none"
        row = by_key.get(key)
        if row is None:
            cid = f"c{len(by_key)}"
            if case is not None:
                cases.append({**case, "id": cid})
            path = native_at.get((r["module"], r["phase"]), "oneDNN")
            row = by_key[key] = {"op": r["op"], "input_shapes": r["input_shapes"],
                                 "dtypes": r["dtypes"], "case_id": cid, "calls": 0,
                                 "in_situ_total_ms": 0.0, "in_situ_path": path,
                                 "note": note if case else (note or "not replayed"),
                                 "modules": []}
        if r.get("module") not in row["modules"]:
            row["modules"].append(r.get("module"))
        row["calls"] += int(r["calls"])
        row["in_situ_total_ms"] += float(r["total_time_ms"] or 0.0)
    return cases, pl.DataFrame(list(by_key.values()), schema=empty.schema)


def target_path(result: dict | None, log: pl.DataFrame, case_id: str) -> str | None:
    """Which kernel the replayed call ran: the native ATen conv op, or oneDNN."""
    if not result or result.get("error"):
        return None
    names = [o[0] for o in (result.get("ops") or [])]
    for n in names:
        if is_native_conv(n):
            return n
    if any("mkldnn" in n for n in names):
        return "oneDNN"
    if not log.is_empty() and "case_id" in log.columns and \
            log.filter((pl.col("case_id") == case_id) & (pl.col("driver") == "conv")).height:
        return "oneDNN"
    return names[0] if names else None


def attach_conv_replay(calls: pl.DataFrame, replay: Any, steps: int) -> pl.DataFrame:
    """Add replay_ms (median wall per call), replay_path, per-step in-situ/projected ms."""
    if calls.is_empty():
        return calls.with_columns(*(pl.lit(None, pl.Float64).alias(c) for c in
                                    ("replay_ms", "in_situ_ms", "calls_per_step",
                                     "projected_ms")), pl.lit(None, pl.Utf8).alias("replay_path"))
    wall, path, notes = [], [], []
    for cid, note in calls.select("case_id", "note").iter_rows():
        res = replay.cases.get(cid) if replay is not None else None
        wall.append(replay.wall_ms(cid) if replay is not None else None)
        path.append(target_path(res, replay.log if replay is not None else pl.DataFrame(), cid))
        err = (res or {}).get("error")
        notes.append(f"replay failed: {err}" if err else note)
    return calls.with_columns(
        pl.Series("replay_ms", wall, dtype=pl.Float64),
        pl.Series("replay_path", path, dtype=pl.Utf8),
        pl.Series("note", notes, dtype=pl.Utf8),
        (pl.col("in_situ_total_ms") / pl.col("calls")).alias("in_situ_ms"),
        (pl.col("calls") / steps).alias("calls_per_step"),
    ).with_columns(
        (pl.col("calls_per_step") * pl.coalesce("replay_ms", "in_situ_ms")).alias("projected_ms"),
        (pl.col("in_situ_total_ms") / steps).alias("in_situ_total_ms"))


# --------------------------------------------------------------------------- calibration
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


# --------------------------------------------------------------------------- the step
def _phase(col: str = "phase") -> pl.Expr:
    return pl.col(col).fill_null(OUTSIDE)


def call_case_ids(calls: pl.DataFrame) -> pl.DataFrame:
    """Each conv root call's case: one row per (op, module, input_shapes, dtypes).

    A conv-call table stored without ``modules`` (before it had them) maps each
    (op, input_shapes, dtypes) to its first case, so no call is counted twice.
    """
    if "modules" in calls.columns:
        return (calls.select("op", "input_shapes", "dtypes", "case_id",
                             pl.col("modules").alias("module"))
                .explode("module").unique(subset=["op", "module", "input_shapes", "dtypes"],
                                          keep="first", maintain_order=True))
    return calls.select("op", "input_shapes", "dtypes", "case_id").unique(
        subset=["op", "input_shapes", "dtypes"], keep="first", maintain_order=True)


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


__all__ = ["CONV_CALLS", "CONV_ROOTS", "KERNEL_PARTS", "NATIVE_KERNELS", "ONEDNN_OTHER", "OTHER_OPS",
           "PYTHON_GAPS", "STEP_PARTS", "attach_conv_replay", "by_part", "by_phase",
           "calibrate_ops", "call_case_ids", "conv_calls", "conv_geometry",
           "native_calibration", "step_parts", "step_summary", "target_path", "whatif_step"]

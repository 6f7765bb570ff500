"""PyTorch's convolution calls, replayed whole: one replay case per unique call.

The step model's ``conv calls`` part (``step_model.py``): each ``aten::convolution`` and
``aten::convolution_backward`` call of the Run becomes a case the worker replays at the
target (its stride, padding and dilation from the module's oneDNN primitive, or the
smallest that fit), and the replay says which kernel PyTorch chose there.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from ..vocabulary import CHANNELS_LAST_TAGS, CONV_BACKWARD_OP, CONV_FORWARD_OP, ONEDNN_DTYPE, is_native_conv, op_dtype
from .cases import conv_case, parse_shapes
from .nesting import CONV_ROOTS


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


__all__ = ["attach_conv_replay", "call_case_ids", "conv_calls", "conv_geometry", "target_path"]

"""Replay cases: what to call, at which shape, to re-run one primitive or one op alone.

A case is a small JSON-able dict the worker turns into a PyTorch call. oneDNN primitives
become the aten call that makes PyTorch create that primitive (``aten::convolution`` /
``convolution_backward`` with one output mask per direction, ``matmul``, or an op on a
``to_mkldnn`` tensor); framework ops become the same aten op at the recorded input
shapes and dtypes, with the scalar arguments the profiler does not record filled in
(pooling windows from the model's modules where the Run names a built-in workload).
"""

from __future__ import annotations

import ast
import re
from typing import Any

import polars as pl

from ..vocabulary import CHANNELS_LAST_TAGS, CONV_DRIVERS, op_family

# Grouping key of a unique oneDNN primitive (benchdnn's view: same problem, same call).
PRIM_KEY = ("driver", "prop_kind", "direction", "cfg", "src_tag", "wei_tag", "dst_tag",
            "alg", "post_ops", "problem")
LOOSE_KEY = ("driver", "direction", "cfg", "problem")
POOL_CANDIDATES = ((3, 2, 1), (2, 2, 0), (3, 1, 1), (3, 2, 0), (2, 1, 0), (1, 1, 0))


def parse_shapes(text: str | None) -> list:
    """``[[2, 64, 8, 8], [], [64]]`` -> nested lists (empty list if unreadable)."""
    if not text:
        return []
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return []
    return value if isinstance(value, list) else []


# --------------------------------------------------------------------------- oneDNN cases
def tag_rank(tag: str | None) -> int | None:
    """Number of dimensions of a format tag: ``aBcd8b`` -> 4."""
    if not tag:
        return None
    m = re.match(r"[a-zA-Z]+", tag)
    return len(m.group(0)) if m else None


def _conv_out(i: int, k: int, s: int, d: int, p: int, transposed: bool, op: int = 0) -> int:
    if transposed:
        return (i - 1) * s - 2 * p + d * (k - 1) + 1 + op
    return (i + 2 * p - d * (k - 1) - 1) // s + 1


def conv_case(row: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """The aten call reproducing a conv/deconv primitive, or (None, why not)."""
    rank = tag_rank(row.get("src_tag")) or tag_rank(row.get("dst_tag")) or 4
    spatial = {3: ("w",), 4: ("h", "w"), 5: ("d", "h", "w")}.get(rank)
    if spatial is None:
        return None, f"{rank}-d tensors"
    if any(row.get(f) is None for f in ("mb", "g", "ic", "oc")):
        return None, "problem descriptor not decoded"
    transposed = row["driver"] == "deconv"
    f = {name: [int(row.get(f"{name}{ax}") or 0) for ax in spatial]
         for name in ("i", "o", "k", "s", "d", "p")}
    ins, outs = [int(row[f"i{ax}"]) for ax in spatial], [int(row[f"o{ax}"]) for ax in spatial]
    ks = [max(1, v) for v in f["k"]]
    ss = [max(1, v) for v in f["s"]]
    ds = [v + 1 for v in f["d"]]  # oneDNN counts dilation from 0, PyTorch from 1
    ps = f["p"]
    out_pad = [0] * len(spatial)
    for j in range(len(spatial)):
        want = outs[j]
        got = _conv_out(ins[j], ks[j], ss[j], ds[j], ps[j], transposed)
        if transposed and 0 <= want - got < max(ss[j], ds[j]):
            out_pad[j] = want - got
        elif got != want:
            return None, (f"padding {ps[j]} cannot give output {want} from input {ins[j]} "
                          "with symmetric padding (PyTorch pads both sides alike)")
    direction = row.get("direction") or "FWD_D"
    bias = direction in ("FWD_B", "BWD_WB")
    return {
        "kind": "conv", "transposed": transposed, "direction": direction,
        "mb": int(row["mb"]), "g": int(row["g"] or 1), "ic": int(row["ic"]), "oc": int(row["oc"]),
        "in": ins, "out": outs, "k": ks, "s": ss, "d": ds, "p": ps, "output_padding": out_pad,
        "bias": bias, "dtype": row.get("src_dt") or "f32",
        # PyTorch runs deconvolutions channels-last itself (reordering NCHW input);
        # convolutions see channels-last only when the model's tensors are.
        "channels_last": not transposed and (row.get("src_tag") in CHANNELS_LAST_TAGS
                                             or row.get("dst_tag") in CHANNELS_LAST_TAGS),
    }, None


def _dims(row: dict[str, Any]) -> list[int] | None:
    text = row.get("dims") or row.get("problem") or ""
    m = re.fullmatch(r"\d+(x\d+)*", text.split(":")[0])
    return [int(v) for v in m.group(0).split("x")] if m else None


def primitive_case(row: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """A replay case for one unique primitive, or (None, the reason there is none)."""
    driver = row.get("driver")
    if driver in CONV_DRIVERS:
        return conv_case(row)
    if driver == "matmul":
        m, n, k, batch = row.get("m"), row.get("n"), row.get("k"), row.get("batch") or 1
        if not (m and n and k):
            return None, "matmul sizes not decoded"
        pre = [int(batch)] if batch and batch > 1 else []
        return {"kind": "matmul", "a": pre + [int(m), int(k)], "b": pre + [int(k), int(n)],
                "dtype": row.get("src_dt") or "f32"}, None
    dims = _dims(row)
    alg = (row.get("alg") or "").lower()
    if driver == "reorder":
        if not dims or len(dims) != 4:
            return None, "reorder of non-4-d data: replayed only inside the primitive that made it"
        plain = {"abcd"}
        if row.get("src_tag") in plain and row.get("dst_tag") in plain:
            return {"kind": "reorder_to_blocked", "dims": dims}, None  # to_mkldnn's plain copy
        if row.get("src_tag") in plain and row.get("dst_tag") not in plain:
            return {"kind": "reorder_to_blocked", "dims": dims}, None
        if row.get("dst_tag") in plain and row.get("src_tag") not in plain:
            return {"kind": "reorder_to_plain", "dims": dims}, None
        return None, "weight or format-to-format reorder: replayed only inside its primitive"
    if dims is None:
        return None, f"{driver} dims not decoded"
    if driver == "eltwise" and "relu" in alg:
        return {"kind": "eltwise_relu", "dims": dims}, None
    if driver in ("binary", "sum") and ("add" in alg or driver == "sum"):
        return {"kind": "binary_add", "dims": dims}, None
    if driver == "bnorm" and row.get("direction") == "FWD_I":
        return {"kind": "bnorm_inference", "dims": dims}, None
    if driver == "softmax":
        return {"kind": "softmax", "dims": dims}, None
    if driver == "pool" and row.get("kh"):
        kind = "pool_max" if "max" in alg else "pool_avg"
        return {"kind": kind, "dims": [int(row["mb"]), int(row["ic"]), int(row["ih"]), int(row["iw"])],
                "k": [int(row["kh"]), int(row["kw"])], "s": [int(row["sh"]), int(row["sw"])],
                "p": [int(row["ph"]), int(row["pw"])]}, None
    return None, f"no PyTorch call reproduces {driver} {row.get('direction') or ''} alone".strip()


# --------------------------------------------------------------------------- framework ops
def pool_params(op: str, shapes: list, hparams: dict[str, Any] | None,
                out_hw: list[int] | None) -> tuple[dict[str, Any], str | None]:
    """kernel/stride/padding of a pooling op: from the model's module, else inferred."""
    if hparams:
        return {k: hparams[k] for k in ("kernel_size", "stride", "padding", "dilation", "ceil_mode")
                if k in hparams}, None
    inp = shapes[1] if op.endswith("_backward") and len(shapes) > 1 else shapes[0]
    if op.endswith("_backward") and shapes and isinstance(shapes[0], list) and len(shapes[0]) == 4:
        out_hw = shapes[0][2:]
    h = inp[2] if isinstance(inp, list) and len(inp) == 4 else None
    for k, s, p in POOL_CANDIDATES:
        if h is not None and out_hw and (h + 2 * p - k) // s + 1 == out_hw[0]:
            return ({"kernel_size": [k, k], "stride": [s, s], "padding": [p, p]},
                    f"pooling window inferred as k{k} s{s} p{p} from the shapes")
    return ({"kernel_size": [3, 3], "stride": [2, 2], "padding": [1, 1]},
            "pooling window not recorded: assumed k3 s2 p1")


def reduce_params(shapes: list) -> tuple[dict[str, Any], str | None]:
    """dim/keepdim of sum/mean: from an ``out`` shape when recorded, else the spatial dims."""
    inp = shapes[0] if shapes else []
    out = shapes[-1] if len(shapes) >= 5 and isinstance(shapes[-1], list) else None
    if isinstance(inp, list) and out and len(out) == len(inp):
        dims = [i for i, (a, b) in enumerate(zip(inp, out)) if a != b]
        return {"dim": dims, "keepdim": True}, None
    if isinstance(inp, list) and len(inp) == 4:
        return {"dim": [2, 3], "keepdim": True}, "reduced dims not recorded: assumed spatial (2, 3)"
    return {"dim": [len(inp) - 1] if inp else [0], "keepdim": False}, \
        "reduced dims not recorded: assumed the last"


def op_case(op: str, shapes: list, dtypes: list, hparams: dict[str, Any] | None,
            out_hw: list[int] | None = None) -> tuple[dict[str, Any] | None, str | None]:
    """A replay case for a framework op at its recorded shapes (plus a note on guesses)."""
    family = op_family(op)
    if family is None:
        return None, "not a compute kernel ProfileDNN replays"
    if not shapes or len(shapes) != len(dtypes):
        return None, "input shapes not recorded (capture with shapes, not --light)"
    name = op.split("::", 1)[1]
    params: dict[str, Any] = {}
    note = None
    if family == "pool" and "adaptive" not in name:
        params, note = pool_params(name, shapes, hparams, out_hw)
    elif family == "pool":
        params = {"output_size": [1, 1]}
    elif family == "reduce":
        params, note = reduce_params(shapes)
    elif family == "loss":
        logits = next((s for s in shapes if isinstance(s, list) and len(s) >= 2), None)
        if logits:
            params["target_high"] = logits[1]
    return {"kind": "op", "op": op, "shapes": shapes, "dtypes": dtypes, "params": params}, note


def unique_primitives(prims: pl.DataFrame) -> pl.DataFrame:
    """One row per unique primitive (``PRIM_KEY``) with its calls and in-situ times."""
    keys = [k for k in PRIM_KEY if k in prims.columns]
    first = [c for c in prims.columns if c not in keys and c not in
             ("line", "time_ms", "timestamp_ms", "op", "module", "phase", "step", "op_event",
              "event", "impl")]
    return (
        prims.group_by(keys, maintain_order=True)
        .agg(
            pl.len().alias("calls"),
            pl.col("time_ms").median().alias("in_situ_ms"),
            pl.col("time_ms").sum().alias("in_situ_total_ms"),
            pl.col("impl").mode().first().alias("impl"),
            pl.col("impl").n_unique().alias("impl_variants"),
            *[pl.col(c).first() for c in first],
        )
        .with_row_index("pid")
        .with_columns(pl.format("p{}", pl.col("pid")).alias("case_id"))
        .drop("pid")
    )


__all__ = [
    "LOOSE_KEY", "PRIM_KEY", "conv_case", "op_case",
    "parse_shapes", "pool_params", "primitive_case", "reduce_params", "tag_rank",
    "unique_primitives",
]

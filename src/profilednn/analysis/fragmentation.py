"""Fragmentation: where the trace breaks into many short ops (seed 000, 2.1).

A highly fragmented trace spends its time switching between small kernels: each
short op pays dispatch and a full pass over memory, and the gaps between them are
framework overhead. Such stretches are fusion candidates. Reorder chains are the
oneDNN side of the same story: layouts converted back and forth between kernels.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import polars as pl

from .taxonomy import NON_KERNEL_NAMESPACES, is_weight_tag

AUTOGRAD_PREFIX = "autograd::engine::evaluate_function: "

DEFAULT_SHORT_MS = 0.1
DEFAULT_MIN_OPS = 8

FRAGMENT_SCHEMA: dict[str, pl.DataType] = {
    "tid": pl.Int64,
    "step": pl.Int64,
    "phase": pl.Utf8,
    "parent": pl.Utf8,
    "module": pl.Utf8,
    "start_ms": pl.Float64,
    "end_ms": pl.Float64,
    "n_ops": pl.Int64,
    "op_ms": pl.Float64,
    "gap_ms": pl.Float64,
    "span_ms": pl.Float64,
    "ops": pl.Utf8,
}


@dataclass
class _Event:
    name: str
    start: float
    dur: float
    module: str | None
    phase: str | None
    step: int | None
    children: list["_Event"] = field(default_factory=list)

    @property
    def end(self) -> float:
        return self.start + self.dur


def _forest(events: pl.DataFrame) -> dict[int, list[_Event]]:
    """Rebuild the call trees (per thread) from start times, durations and depths."""
    roots: dict[int, list[_Event]] = {}
    ordered = events.sort(["tid", "start_ms", "depth"])
    cols = [ordered[c].to_list() for c in ("tid", "op", "start_ms", "dur_ms", "depth", "module", "phase", "step")]
    stack: list[tuple[int, _Event]] = []
    current_tid = None
    for tid, name, start, dur, depth, module, phase, step in zip(*cols):
        if tid != current_tid:
            current_tid, stack = tid, []
            roots.setdefault(tid, [])
        ev = _Event(str(name), float(start), float(dur or 0.0), module, phase, step)
        depth = int(depth or 0)
        while stack and (stack[-1][0] >= depth or start >= stack[-1][1].end):
            stack.pop()
        if stack:
            stack[-1][1].children.append(ev)
        else:
            roots[tid].append(ev)
        stack.append((depth, ev))
    return roots


def _is_native(name: str) -> bool:
    ns = name.split("::", 1)[0] if "::" in name else None
    return ns is not None and ns not in NON_KERNEL_NAMESPACES


def _short_name(name: str) -> str:
    return name[len(AUTOGRAD_PREFIX):] if name.startswith(AUTOGRAD_PREFIX) else name


def _fragment_row(tid: int, parent: str, run: list[_Event]) -> dict[str, object]:
    op_ms = sum(e.dur for e in run)
    span = run[-1].end - run[0].start
    names = Counter(_short_name(e.name) for e in run)
    modules = Counter(e.module for e in run if e.module)
    phases = Counter(e.phase for e in run if e.phase)
    return {
        "tid": tid,
        "step": run[0].step,
        "phase": phases.most_common(1)[0][0] if phases else None,
        "parent": parent,
        "module": modules.most_common(1)[0][0] if modules else None,
        "start_ms": run[0].start,
        "end_ms": run[-1].end,
        "n_ops": len(run),
        "op_ms": op_ms,
        "gap_ms": max(span - op_ms, 0.0),
        "span_ms": span,
        "ops": ", ".join(f"{n}\u00d7{c}" for n, c in names.most_common(4)),
    }


def _scan(tid: int, parent: str, siblings: list[_Event], short_ms: float, min_ops: int, out: list) -> None:
    run: list[_Event] = []
    for ev in siblings + [None]:  # type: ignore[list-item]
        if ev is not None and ev.dur < short_ms:
            run.append(ev)
            continue
        if len(run) >= min_ops:
            out.append(_fragment_row(tid, parent, run))
        run = []
        # look inside long wrappers (Optimizer.step, autograd nodes) whose own time is
        # framework code; a native op's children are its implementation details, and the
        # time between them is the op's own work, not overhead
        if ev is not None and ev.children and not _is_native(ev.name):
            _scan(tid, _short_name(ev.name), ev.children, short_ms, min_ops, out)


def fragments(
    op_events: pl.DataFrame, short_ms: float = DEFAULT_SHORT_MS, min_ops: int = DEFAULT_MIN_OPS
) -> pl.DataFrame:
    """Runs of at least ``min_ops`` consecutive sibling ops, each shorter than ``short_ms``.

    Siblings are ops at the same nesting level under the same parent (the top level of a
    thread, or a long wrapper such as ``Optimizer.step`` whose children are many small
    per-parameter ops); long ops break a run, and long wrappers (not native ops, whose
    children are implementation details) are searched inside. ``op_ms`` is the
    ops' own time, ``gap_ms`` the time between them, ``span_ms`` the wall time the
    stretch costs. Sorted by ``span_ms``, largest first.
    """
    rows: list[dict[str, object]] = []
    if op_events.height:
        for tid, roots in _forest(op_events).items():
            _scan(int(tid), "(top level)", roots, short_ms, min_ops, rows)
    df = pl.DataFrame(rows, schema=FRAGMENT_SCHEMA)
    return df.sort(["span_ms", "start_ms"], descending=[True, False])


def fragmentation_summary(frags: pl.DataFrame, n_steps: int, step_ms: float | None) -> pl.DataFrame:
    """Fragments per phase: count, ops, wall time per step and share of the step."""
    out = (
        frags.group_by("phase")
        .agg(
            fragments=pl.len(),
            n_ops=pl.col("n_ops").sum(),
            span_ms=pl.col("span_ms").sum() / n_steps,
            gap_ms=pl.col("gap_ms").sum() / n_steps,
        )
        .sort("span_ms", descending=True)
    )
    denom = step_ms or None
    return out.with_columns(
        share_pct=(pl.col("span_ms") / denom * 100.0) if denom else pl.lit(None, pl.Float64)
    )


# ------------------------------------------------------------------------- reorders
def _ordered(prims: pl.DataFrame) -> pl.DataFrame:
    keys = [c for c in ("step", "timestamp_ms", "line") if c in prims.columns]
    return prims.sort(keys, nulls_last=True) if keys else prims


def reorders(prims: pl.DataFrame, n_steps: int, step_ms: float | None = None) -> pl.DataFrame:
    """Reorder time by layout conversion (src -> dst), split into weights and activations."""
    r = prims.filter(pl.col("driver") == "reorder")
    out = (
        r.with_columns(
            tensor=pl.when(
                is_weight_tag(pl.col("src_tag").fill_null("")) | is_weight_tag(pl.col("dst_tag").fill_null(""))
            )
            .then(pl.lit("weights"))
            .otherwise(pl.lit("activations"))
        )
        .group_by(["tensor", "src_tag", "dst_tag"])
        .agg(calls=pl.len(), time_ms=pl.col("time_ms").sum())
        .with_columns(ms_per_step=pl.col("time_ms") / n_steps)
        .sort(["time_ms", "src_tag", "dst_tag"], descending=[True, False, False])
    )
    denom = step_ms or float(prims["time_ms"].sum() or 0.0) or None
    return out.with_columns(
        share_pct=(pl.col("ms_per_step") / denom * 100.0) if denom else pl.lit(0.0)
    )


def reorder_chains(prims: pl.DataFrame, min_len: int = 2) -> pl.DataFrame:
    """Consecutive reorders with no other oneDNN primitive between them.

    ``round_trips`` counts pairs in a chain that convert a tensor of the same shape
    back to the layout it just left (``aBcd8b -> abcd`` then ``abcd -> aBcd8b``): the
    work a layout kept end to end (channels_last, or a fused native op) would avoid.
    """
    schema = {
        "step": pl.Int64,
        "start_ms": pl.Float64,
        "n": pl.Int64,
        "time_ms": pl.Float64,
        "round_trips": pl.Int64,
        "path": pl.Utf8,
        "module": pl.Utf8,
        "phase": pl.Utf8,
    }
    if prims.height == 0:
        return pl.DataFrame(schema=schema)
    df = _ordered(prims).with_columns(_r=(pl.col("driver") == "reorder"))
    brk = pl.col("_r") != pl.col("_r").shift(1)
    if "step" in df.columns:
        brk = brk | (pl.col("step").fill_null(-1) != pl.col("step").fill_null(-1).shift(1))
    df = df.with_columns(_run=brk.fill_null(True).cum_sum())
    rows = []
    for _, g in df.filter(pl.col("_r")).group_by("_run", maintain_order=True):
        if g.height < min_len:
            continue
        src = g["src_tag"].fill_null("?").to_list()
        dst = g["dst_tag"].fill_null("?").to_list()
        dims = g["dims"].to_list() if "dims" in g.columns else [None] * g.height
        trips = sum(
            1
            for i in range(1, g.height)
            for j in range(i)
            if src[i] == dst[j] and dst[i] == src[j] and dims[i] == dims[j]
        )
        rows.append(
            {
                "step": g["step"][0] if "step" in g.columns else None,
                "start_ms": g["timestamp_ms"][0] if "timestamp_ms" in g.columns else None,
                "n": g.height,
                "time_ms": float(g["time_ms"].sum()),
                "round_trips": trips,
                "path": ", ".join(f"{s}\u2192{d}" for s, d in zip(src, dst)),
                "module": next((m for m in g["module"].to_list() if m), None) if "module" in g.columns else None,
                "phase": next((p for p in g["phase"].to_list() if p), None) if "phase" in g.columns else None,
            }
        )
    return pl.DataFrame(rows, schema=schema).sort(["time_ms"], descending=True)

"""Turn marker lines, primitives and profiler events into the Run's tables.

Markers (``profilednn_mark,<unix ms>,<event>,...``; ``verbose/markers.py``) sit in the verbose log in exact order
with oneDNN's primitive lines. A pass over the markers yields the state after each one
(step, phase, module); primitives take the state of the last marker above them (by line),
framework ops the state in force when they started (by time: the profiler, oneDNN and the
markers share the Unix clock). Each primitive is also placed inside the innermost
framework op whose call contains its timestamp.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from ..verbose.markers import Marker
from ..vocabulary import PSEUDO_MODULES


@dataclass
class Timeline:
    """What the markers say: state intervals, spans and step boundaries."""

    states: pl.DataFrame                      # line, time_ms, step, phase, module
    # kind (module, phase, eval), name, module_type, phase, step, start_ms, end_ms, depth
    spans: pl.DataFrame
    step_bounds: dict[int, tuple[float, float]] = field(default_factory=dict)
    complete_steps: list[int] = field(default_factory=list)
    window: tuple[float, float] | None = None


def closure_steps(markers: list[Marker]) -> set[int]:
    """Indices of ``opt_begin,step`` markers whose step ran forward or backward inside.

    Lightning and LBFGS call ``optimizer.step(closure)``: the closure's forward and
    backward are forward and backward, and only what runs after a backward is the update.
    """
    found: set[int] = set()
    stack: list[int] = []
    for i, mk in enumerate(markers):
        if mk.event == "opt_begin" and mk.args[:1] == ["step"]:
            stack.append(i)
        elif mk.event == "opt_end" and mk.args[:1] == ["step"]:
            if stack:
                stack.pop()
        elif stack and mk.event in ("fwd_begin", "loss_begin", "backward_begin"):
            found.add(stack[0])
    return found


def build_timeline(markers: list[Marker], module_types: dict[str, str]) -> Timeline:
    """Run the marker state machine."""
    rows: list[tuple[int, float, int, str, str | None]] = []
    spans: list[dict[str, Any]] = []
    step = 0
    step_start: float | None = None
    bounds: dict[int, tuple[float, float]] = {}
    complete: list[int] = []
    fwd_stack: list[tuple[str, str, float, int]] = []  # name, kind, start, depth
    explicit: list[str] = []
    in_bwd = 0
    bwd_module: str | None = None
    bwd_start: float | None = None
    opt_depth = 0
    opt_counted: list[bool] = []  # per open opt_begin,step: does it count as optimizer time
    closures = closure_steps(markers)
    in_closure = 0
    gap = "data"
    window_start = window_end = None
    evaluation: tuple[str, float] | None = None  # the evaluation call in progress: name, start

    def close_bwd_span(t: float) -> None:
        nonlocal bwd_module, bwd_start
        if bwd_module is not None and bwd_start is not None:
            spans.append(dict(kind="module", name=bwd_module, module_type=module_types.get(bwd_module),
                              phase="backward", step=step, start_ms=bwd_start, end_ms=t, depth=0))
        bwd_start = None

    def current() -> tuple[str, str | None]:
        if evaluation is not None:  # evaluation or sampling: time of the step, of no layer
            return "other", None
        if opt_depth > 0:
            return "optimizer", "optimizer"
        if in_bwd > 0:
            return "backward", bwd_module
        if fwd_stack:
            root_kind = fwd_stack[0][1]
            return ("loss" if root_kind == "loss" else "forward"), fwd_stack[-1][0]
        if explicit:
            p = explicit[-1]
            return p, (p if p in PSEUDO_MODULES else None)
        return gap, (gap if gap in PSEUDO_MODULES else None)  # "optimizer" after a closure's backward

    for idx, mk in enumerate(markers):
        t, ev, a = mk.time_ms, mk.event, mk.args
        if ev == "win_open":
            window_start = t
            step = int(a[0]) if a else 0
            step_start = t
            gap = "data"
        elif ev == "win_close":
            window_end = t
            close_bwd_span(t)
        elif ev == "step_end":
            close_bwd_span(t)
            g = int(a[0]) if a else step
            if step_start is not None:
                bounds[g] = (step_start, t)
                complete.append(g)
            step = g + 1
            step_start = t
            gap = "data"
            bwd_module = None
        elif ev in ("fwd_begin", "loss_begin"):
            depth = int(a[0]) if a else len(fwd_stack)
            name = a[1] if len(a) > 1 else "?"
            kind = "loss" if ev == "loss_begin" else (fwd_stack[0][1] if fwd_stack else "fwd")
            fwd_stack.append((name, kind, t, depth))
        elif ev in ("fwd_end", "loss_end"):
            if fwd_stack:
                name, kind, start, depth = fwd_stack.pop()
                spans.append(dict(kind="module", name=name, module_type=module_types.get(name),
                                  phase="loss" if kind == "loss" else "forward", step=step,
                                  start_ms=start, end_ms=t, depth=depth))
                if not fwd_stack:
                    gap = "loss"
        elif ev == "backward_begin":
            in_bwd += 1
            bwd_module, bwd_start = None, None
        elif ev == "backward_end":
            close_bwd_span(t)
            in_bwd = max(0, in_bwd - 1)
            bwd_module = None
            gap = "optimizer" if in_closure else "other"
        elif ev == "bwd_begin":
            name = a[0] if a else "?"
            if name != bwd_module or bwd_start is None:
                close_bwd_span(t)
                bwd_module, bwd_start = name, t
        elif ev == "bwd_end":
            pass  # the module's backward runs on until the next module's begins
        elif ev == "opt_begin":
            if a[:1] == ["step"]:
                # a closure step is optimizer time only after its backward (via ``gap``)
                counted = idx not in closures
                opt_counted.append(counted)
                if not counted:
                    in_closure += 1
                    gap = "other"
            else:
                counted = True
            opt_depth += int(counted)
        elif ev == "opt_end":
            counted = opt_counted.pop() if a[:1] == ["step"] and opt_counted else True
            if counted:
                opt_depth = max(0, opt_depth - 1)
            else:
                in_closure = max(0, in_closure - 1)
                gap = "other"
        elif ev == "eval_begin":
            evaluation = (a[0] if a else "?", t)
        elif ev == "eval_end":
            if evaluation is not None:
                spans.append(dict(kind="eval", name=evaluation[0], module_type=module_types.get(evaluation[0]),
                                  phase="other", step=step, start_ms=evaluation[1], end_ms=t, depth=0))
            evaluation = None
            gap = "other"  # what the evaluation does between and after its calls (sampling, saving)
        elif ev == "phase_begin":
            explicit.append(a[0] if a else "other")
        elif ev == "phase_end":
            if explicit:
                explicit.pop()
        phase, module = current()
        rows.append((mk.line, t, step, phase, module))

    if window_end is None and markers:
        window_end = markers[-1].time_ms
    if step_start is not None and window_end is not None and step not in bounds:
        bounds[step] = (step_start, window_end)

    states = pl.DataFrame(
        rows, schema={"line": pl.Int64, "time_ms": pl.Float64, "step": pl.Int64,
                      "phase": pl.Utf8, "module": pl.Utf8}, orient="row",
    )
    # Phase spans: merge consecutive state intervals with the same (step, phase).
    phase_spans: list[dict[str, Any]] = []
    for i, (line, t, st, ph, _mod) in enumerate(rows):
        t_next = rows[i + 1][1] if i + 1 < len(rows) else (window_end or t)
        if t_next <= t:
            continue
        last = phase_spans[-1] if phase_spans else None
        if last and last["name"] == ph and last["step"] == st and abs(last["end_ms"] - t) < 1e-9:
            last["end_ms"] = t_next
        else:
            phase_spans.append(dict(kind="phase", name=ph, module_type=None, phase=ph, step=st,
                                    start_ms=t, end_ms=t_next, depth=0))
    span_schema = {"kind": pl.Utf8, "name": pl.Utf8, "module_type": pl.Utf8, "phase": pl.Utf8,
                   "step": pl.Int64, "start_ms": pl.Float64, "end_ms": pl.Float64, "depth": pl.Int64}
    spans_df = pl.DataFrame(phase_spans + spans, schema=span_schema)
    return Timeline(
        states=states, spans=spans_df, step_bounds=bounds, complete_steps=complete,
        window=(window_start, window_end) if window_start is not None else None,
    )


# --------------------------------------------------------------------------- joins
def attribute_primitives(prims: pl.DataFrame, states: pl.DataFrame) -> pl.DataFrame:
    """Give each primitive the (step, phase, module) of the last marker above its line."""
    if prims.is_empty() or states.is_empty():
        return prims.with_columns(
            pl.lit(None, pl.Int64).alias("step"), pl.lit(None, pl.Utf8).alias("phase"),
            pl.lit(None, pl.Utf8).alias("module"),
        )
    return prims.sort("line").join_asof(
        states.select("line", "step", "phase", "module"), on="line", strategy="backward"
    )


def attribute_by_time(df: pl.DataFrame, states: pl.DataFrame, time_col: str) -> pl.DataFrame:
    """Give each row the (step, phase, module) in force at ``time_col``."""
    st = states.select(pl.col("time_ms").alias(time_col), "step", "phase", "module").sort(time_col)
    return df.sort(time_col).join_asof(st, on=time_col, strategy="backward")


def innermost_ops(
    prim_times: list[float | None], ev_start: list[float], ev_end: list[float], ev_parent: list[int]
) -> list[int]:
    """For each primitive timestamp, the index of the innermost op event containing it (-1: none).

    ``ev_*`` are sorted by start; ``ev_parent`` holds each event's parent index (-1 for
    top level). Ops on one thread nest properly, so the latest-starting op at or before
    ``t`` either contains ``t`` or one of its ancestors does.
    """
    out: list[int] = []
    for t in prim_times:
        if t is None:
            out.append(-1)
            continue
        i = bisect.bisect_right(ev_start, t) - 1
        while i >= 0 and ev_end[i] < t:
            i = ev_parent[i]
        out.append(i)
    return out

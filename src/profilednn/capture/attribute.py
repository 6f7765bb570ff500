"""Turn marker lines, primitives and profiler events into the Run's tables.

Markers (``profilednn_mark,<unix ms>,<event>,...``; ``verbose/markers.py``) sit in the verbose log in exact order
with oneDNN's primitive lines. A pass over the markers yields the state after each one
(step, phase, module); primitives take the state of the last marker above them (by line),
framework ops the state in force when they started, or after the first marker inside them
(``capture_tables.at_marker``; by time: the profiler, oneDNN and the markers share the Unix
clock). Each primitive is also placed inside the innermost framework op whose call contains
its timestamp.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from ..verbose.markers import (
    BACKWARD_BEGIN, BACKWARD_END, BWD_BEGIN, EVAL_BEGIN, EVAL_END, FWD_BEGIN, FWD_END, LOSS_BEGIN, LOSS_END,
    OPT_BEGIN, OPT_END, OPT_STEP, PHASE_BEGIN, PHASE_END, STEP_END, WIN_CLOSE, WIN_OPEN, Marker,
)
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
        if mk.event == OPT_BEGIN and mk.args[:1] == [OPT_STEP]:
            stack.append(i)
        elif mk.event == OPT_END and mk.args[:1] == [OPT_STEP]:
            if stack:
                stack.pop()
        elif stack and mk.event in (FWD_BEGIN, LOSS_BEGIN, BACKWARD_BEGIN):
            found.add(stack[0])
    return found


SPAN_SCHEMA = {"kind": pl.Utf8, "name": pl.Utf8, "module_type": pl.Utf8, "phase": pl.Utf8,
               "step": pl.Int64, "start_ms": pl.Float64, "end_ms": pl.Float64, "depth": pl.Int64,
               "faults": pl.Int64}
STATE_SCHEMA = {"line": pl.Int64, "time_ms": pl.Float64, "step": pl.Int64, "phase": pl.Utf8, "module": pl.Utf8}


class _TimelineBuilder:
    """The marker state machine: one handler per marker event, the (step, phase, module) each
    marker leaves the program in, and the module and evaluation spans it closes."""

    def __init__(self, markers: list[Marker], module_types: dict[str, str]) -> None:
        self.module_types = module_types
        self.rows: list[tuple[int, float, int, str, str | None]] = []
        self.spans: list[dict[str, Any]] = []
        self.step = 0
        self.step_start: float | None = None
        self.bounds: dict[int, tuple[float, float]] = {}
        self.complete: list[int] = []
        self.fwd_stack: list[tuple[str, str, float, int, int | None]] = []  # name, kind, start, depth, faults
        self.faults: int | None = None  # the minor faults the marker being read carries
        self.row_faults: list[int | None] = []  # ... and each row's (``rows``)
        self.explicit: list[str] = []
        self.in_bwd = 0
        self.bwd_module: str | None = None
        self.bwd_start: float | None = None
        self.bwd_start_faults: int | None = None
        self.opt_depth = 0
        self.opt_counted: list[bool] = []  # per open opt_begin,step: does it count as optimizer time
        self.closures = closure_steps(markers)
        self.in_closure = 0
        self.gap = "data"
        self.window_start: float | None = None
        self.window_end: float | None = None
        self.evaluation: tuple[str, float, int | None] | None = None  # the evaluation in progress: name, start, faults
        self.handlers = {
            WIN_OPEN: self.win_open, WIN_CLOSE: self.win_close, STEP_END: self.step_end,
            FWD_BEGIN: self.fwd_begin, LOSS_BEGIN: self.loss_begin, FWD_END: self.fwd_end,
            LOSS_END: self.fwd_end, BACKWARD_BEGIN: self.backward_begin, BACKWARD_END: self.backward_end,
            BWD_BEGIN: self.bwd_begin, OPT_BEGIN: self.opt_begin, OPT_END: self.opt_end,
            EVAL_BEGIN: self.eval_begin, EVAL_END: self.eval_end, PHASE_BEGIN: self.phase_begin,
            PHASE_END: self.phase_end,
        }  # bwd_end: the module's backward runs on until the next module's begins

    def _span(self, kind: str, name: str, phase: str, start: float, end: float, depth: int = 0,
              start_faults: int | None = None) -> None:
        """A closed span; its faults are the closing marker's count less the opening one's."""
        faults = self.faults - start_faults if self.faults is not None and start_faults is not None else None
        self.spans.append(dict(kind=kind, name=name, module_type=self.module_types.get(name), phase=phase,
                               step=self.step, start_ms=start, end_ms=end, depth=depth, faults=faults))

    def close_bwd_span(self, t: float) -> None:
        if self.bwd_module is not None and self.bwd_start is not None:
            self._span("module", self.bwd_module, "backward", self.bwd_start, t, start_faults=self.bwd_start_faults)
        self.bwd_start = None

    def current(self) -> tuple[str, str | None]:
        """The phase and module the program is in after the last marker."""
        if self.evaluation is not None:  # evaluation or sampling: time of the step, of no layer
            return "other", None
        if self.opt_depth > 0:
            return "optimizer", "optimizer"
        if self.in_bwd > 0:
            return "backward", self.bwd_module
        if self.fwd_stack:
            root_kind = self.fwd_stack[0][1]
            return ("loss" if root_kind == "loss" else "forward"), self.fwd_stack[-1][0]
        if self.explicit:
            p = self.explicit[-1]
            return p, (p if p in PSEUDO_MODULES else None)
        return self.gap, (self.gap if self.gap in PSEUDO_MODULES else None)  # "optimizer" after a closure's backward

    # -- one handler per event: (index in markers, time, args) ---------------------------
    def win_open(self, idx: int, t: float, a: list[str]) -> None:
        self.window_start = t
        self.step = int(a[0]) if a else 0
        self.step_start = t
        self.gap = "data"

    def win_close(self, idx: int, t: float, a: list[str]) -> None:
        self.window_end = t
        self.close_bwd_span(t)

    def step_end(self, idx: int, t: float, a: list[str]) -> None:
        self.close_bwd_span(t)
        g = int(a[0]) if a else self.step
        if self.step_start is not None:
            self.bounds[g] = (self.step_start, t)
            self.complete.append(g)
        self.step = g + 1
        self.step_start = t
        self.gap = "data"
        self.bwd_module = None

    def fwd_begin(self, idx: int, t: float, a: list[str], *, loss: bool = False) -> None:
        depth = int(a[0]) if a else len(self.fwd_stack)
        name = a[1] if len(a) > 1 else "?"
        kind = "loss" if loss else (self.fwd_stack[0][1] if self.fwd_stack else "fwd")
        self.fwd_stack.append((name, kind, t, depth, self.faults))

    def loss_begin(self, idx: int, t: float, a: list[str]) -> None:
        self.fwd_begin(idx, t, a, loss=True)

    def fwd_end(self, idx: int, t: float, a: list[str]) -> None:
        if self.fwd_stack:
            name, kind, start, depth, start_faults = self.fwd_stack.pop()
            self._span("module", name, "loss" if kind == "loss" else "forward", start, t, depth, start_faults)
            if not self.fwd_stack:
                self.gap = "loss"

    def backward_begin(self, idx: int, t: float, a: list[str]) -> None:
        self.in_bwd += 1
        self.bwd_module, self.bwd_start = None, None

    def backward_end(self, idx: int, t: float, a: list[str]) -> None:
        self.close_bwd_span(t)
        self.in_bwd = max(0, self.in_bwd - 1)
        self.bwd_module = None
        self.gap = "optimizer" if self.in_closure else "other"

    def bwd_begin(self, idx: int, t: float, a: list[str]) -> None:
        name = a[0] if a else "?"
        if name != self.bwd_module or self.bwd_start is None:
            self.close_bwd_span(t)
            self.bwd_module, self.bwd_start, self.bwd_start_faults = name, t, self.faults

    def opt_begin(self, idx: int, t: float, a: list[str]) -> None:
        counted = True
        if a[:1] == [OPT_STEP]:
            # a closure step is optimizer time only after its backward (via ``gap``)
            counted = idx not in self.closures
            self.opt_counted.append(counted)
            if not counted:
                self.in_closure += 1
                self.gap = "other"
        self.opt_depth += int(counted)

    def opt_end(self, idx: int, t: float, a: list[str]) -> None:
        counted = self.opt_counted.pop() if a[:1] == [OPT_STEP] and self.opt_counted else True
        if counted:
            self.opt_depth = max(0, self.opt_depth - 1)
        else:
            self.in_closure = max(0, self.in_closure - 1)
            self.gap = "other"

    def eval_begin(self, idx: int, t: float, a: list[str]) -> None:
        self.evaluation = (a[0] if a else "?", t, self.faults)

    def eval_end(self, idx: int, t: float, a: list[str]) -> None:
        if self.evaluation is not None:
            self._span("eval", self.evaluation[0], "other", self.evaluation[1], t, start_faults=self.evaluation[2])
        self.evaluation = None
        self.gap = "other"  # what the evaluation does between and after its calls (sampling, saving)

    def phase_begin(self, idx: int, t: float, a: list[str]) -> None:
        self.explicit.append(a[0] if a else "other")

    def phase_end(self, idx: int, t: float, a: list[str]) -> None:
        if self.explicit:
            self.explicit.pop()

    # -- the run ---------------------------------------------------------------------------
    def feed(self, markers: list[Marker]) -> None:
        for idx, mk in enumerate(markers):
            handler = self.handlers.get(mk.event)
            self.faults = mk.faults
            if handler is not None:
                handler(idx, mk.time_ms, mk.args)
            phase, module = self.current()
            self.rows.append((mk.line, mk.time_ms, self.step, phase, module))
            self.row_faults.append(mk.faults)
        if self.window_end is None and markers:
            self.window_end = markers[-1].time_ms
        if self.step_start is not None and self.window_end is not None and self.step not in self.bounds:
            self.bounds[self.step] = (self.step_start, self.window_end)

    def phase_spans(self) -> list[dict[str, Any]]:
        """Consecutive state intervals with the same (step, phase), merged, with their faults
        (null where a marker at either end carries none)."""
        out: list[dict[str, Any]] = []
        rows, counts = self.rows, self.row_faults
        for i, (_line, t, st, ph, _mod) in enumerate(rows):
            t_next = rows[i + 1][1] if i + 1 < len(rows) else (self.window_end or t)
            if t_next <= t:
                continue
            f0, f1 = counts[i], counts[i + 1] if i + 1 < len(rows) else None
            faults = f1 - f0 if f0 is not None and f1 is not None else None
            last = out[-1] if out else None
            if last and last["name"] == ph and last["step"] == st and abs(last["end_ms"] - t) < 1e-9:
                last["end_ms"] = t_next
                last["faults"] = last["faults"] + faults if last["faults"] is not None and faults is not None else None
            else:
                out.append(dict(kind="phase", name=ph, module_type=None, phase=ph, step=st,
                                start_ms=t, end_ms=t_next, depth=0, faults=faults))
        return out

    def timeline(self) -> Timeline:
        return Timeline(
            states=pl.DataFrame(self.rows, schema=STATE_SCHEMA, orient="row"),
            spans=pl.DataFrame(self.phase_spans() + self.spans, schema=SPAN_SCHEMA),
            step_bounds=self.bounds, complete_steps=self.complete,
            window=(self.window_start, self.window_end) if self.window_start is not None else None,
        )


def build_timeline(markers: list[Marker], module_types: dict[str, str]) -> Timeline:
    """Run the marker state machine (``_TimelineBuilder``) over ``markers``."""
    builder = _TimelineBuilder(markers, module_types)
    builder.feed(markers)
    return builder.timeline()


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

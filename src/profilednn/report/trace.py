"""``RUN/trace.json``: one Chrome / Perfetto trace of a Run.

Three processes (tracks groups) on one timeline: phase and module spans
(``spans.parquet``), framework ops (``op_events.parquet``) and oneDNN primitives
(``primitives.parquet``, ``timestamp_ms`` + ``time_ms``). Every span is a complete
``"X"`` event; ``"M"`` metadata events name the processes and threads. Timestamps are
microseconds from the first event (all tables share the Unix-epoch ms clock).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

from ..analysis.facade import Analysis
from ..errors import RunError
from ..run import Run, atomic_write_text

PID_SPANS, PID_OPS, PID_PRIMS = 1, 2, 3
PROCESS_NAMES = {PID_SPANS: "Phases and modules", PID_OPS: "Framework ops", PID_PRIMS: "oneDNN primitives"}


def _meta(pid: int, tid: int | None, kind: str, name: str, sort: int | None = None) -> list[dict[str, Any]]:
    base: dict[str, Any] = {"ph": "M", "pid": pid, "name": kind, "args": {"name": name}}
    if tid is not None:
        base["tid"] = tid
    out = [base]
    if sort is not None:
        sort_kind = "process_sort_index" if tid is None else "thread_sort_index"
        out.append({"ph": "M", "pid": pid, **({"tid": tid} if tid is not None else {}),
                    "name": sort_kind, "args": {"sort_index": sort}})
    return out


def _clean(args: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in args.items() if v is not None and v != ""}


def has_timeline(analysis: Analysis) -> bool:
    """Whether the source holds anything with a timestamp (spans, op events, timed primitives)."""
    if analysis.spans is not None and analysis.spans.height:
        return True
    if analysis.op_events is not None and analysis.op_events.height:
        return True
    prims = analysis.primitives
    return prims is not None and prims["timestamp_ms"].drop_nulls().len() > 0


def build_trace(analysis: Analysis) -> dict[str, Any]:
    """The trace as a JSON-ready dict (``traceEvents`` plus ``otherData``)."""
    spans, events, prims = analysis.spans, analysis.op_events, analysis.primitives
    starts = []
    if spans is not None and spans.height:
        starts.append(spans["start_ms"].min())
    if events is not None and events.height:
        starts.append(events["start_ms"].min())
    timed = None
    if prims is not None and prims.height:
        timed = prims.filter(pl.col("timestamp_ms").is_not_null())
        if timed.height:
            starts.append(timed["timestamp_ms"].min())
    starts = [float(s) for s in starts if s is not None]
    if not starts:
        raise RunError(f"{analysis.path}: nothing with a timestamp to trace (no spans, op events or timed primitives)")
    t0 = min(starts)

    def us(ms: float) -> float:
        return round((float(ms) - t0) * 1000.0, 3)

    out: list[dict[str, Any]] = []
    for pid, name in PROCESS_NAMES.items():
        out += _meta(pid, None, "process_name", name, sort=pid)

    if spans is not None and spans.height:
        # phases on track 0, modules on track 1 + their nesting depth
        spans = spans.with_columns(
            _tid=pl.when(pl.col("kind") == "phase").then(0).otherwise(1 + pl.col("depth").fill_null(0))
        )
        for t in sorted(set(spans["_tid"].to_list())):
            out += _meta(PID_SPANS, t, "thread_name", "phases" if t == 0 else f"modules, depth {t - 1}", sort=t)
        for r in spans.iter_rows(named=True):
            out.append({
                "ph": "X", "cat": r["kind"] or "span", "name": r["name"], "pid": PID_SPANS,
                "tid": int(r["_tid"]), "ts": us(r["start_ms"]),
                "dur": round(max(float(r["end_ms"]) - float(r["start_ms"]), 0.0) * 1000.0, 3),
                "args": _clean({"module_type": r["module_type"], "phase": r["phase"], "step": r["step"]}),
            })

    if events is not None and events.height:
        for tid in sorted({int(t or 0) for t in events["tid"].to_list()}):
            out += _meta(PID_OPS, tid, "thread_name", f"thread {tid}", sort=tid)
        for r in events.iter_rows(named=True):
            out.append({
                "ph": "X", "cat": "op", "name": r["op"], "pid": PID_OPS, "tid": int(r["tid"] or 0),
                "ts": us(r["start_ms"]), "dur": round(max(float(r["dur_ms"] or 0.0), 0.0) * 1000.0, 3),
                "args": _clean({"module": r["module"], "phase": r["phase"], "step": r["step"],
                                "shapes": r["input_shapes"], "dtypes": r["dtypes"], "self_ms": r["self_ms"]}),
            })

    untimed = 0
    if prims is not None and prims.height:
        untimed = prims.height - (timed.height if timed is not None else 0)
        out += _meta(PID_PRIMS, 0, "thread_name", "primitives", sort=0)
        for r in (timed if timed is not None else prims).iter_rows(named=True):
            name = r["driver"] + (f" {r['direction']}" if r.get("direction") else "")
            out.append({
                "ph": "X", "cat": "primitive", "name": name, "pid": PID_PRIMS, "tid": 0,
                "ts": us(r["timestamp_ms"]), "dur": round(max(float(r["time_ms"] or 0.0), 0.0) * 1000.0, 3),
                "args": _clean({"impl": r["impl"], "cfg": r["cfg"], "problem": r["problem"],
                                "src_tag": r["src_tag"], "wei_tag": r["wei_tag"], "dst_tag": r["dst_tag"],
                                "op": r["op"], "module": r["module"], "phase": r["phase"], "step": r["step"]}),
            })
    return {
        "traceEvents": out,
        "displayTimeUnit": "ms",
        "otherData": {"run": analysis.id, "t0_unix_ms": t0, "primitives_without_timestamp": untimed},
    }


def write_trace(run: Run | Analysis | str | Path, path: Path | str | None = None) -> Path:
    """Write the trace (default ``RUN/trace.json``) atomically; returns its path."""
    analysis = run if isinstance(run, Analysis) else Analysis(run)
    if analysis.is_log and path is None:
        raise RunError(f"{analysis.path} is a log, not a Run: give the trace an output path")
    target = Path(path) if path is not None else analysis.path / "trace.json"
    atomic_write_text(target, json.dumps(build_trace(analysis), separators=(",", ":")))
    return target

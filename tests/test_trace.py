"""RUN/trace.json: valid Chrome trace JSON with spans, framework ops and primitives."""

from __future__ import annotations

import json

import pytest

from profilednn import Analysis, RunError, write_trace
from profilednn.report.trace import PID_OPS, PID_PRIMS, PID_SPANS

from runfactory import make_run


def load(path):
    data = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict) and isinstance(data["traceEvents"], list)
    return data


def test_trace_has_the_three_kinds_of_events(tmp_path):
    run = make_run(tmp_path, layout="nchw")
    path = write_trace(run)
    assert path == run.path / "trace.json"
    data = load(path)
    events = data["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert {e["ph"] for e in events} == {"X", "M"}
    for e in complete:  # what a Chrome trace complete event needs
        assert isinstance(e["name"], str) and e["name"]
        assert isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float))
        assert e["dur"] >= 0 and isinstance(e["pid"], int) and isinstance(e["tid"], int)
    cats = {e["cat"] for e in complete}
    assert {"phase", "module", "op", "primitive"} <= cats
    assert min(e["ts"] for e in complete) == 0.0  # microseconds from the first event
    a = Analysis(run.path)
    n_prims = a.primitives.height
    assert sum(e["cat"] == "primitive" for e in complete) == n_prims
    assert sum(e["cat"] == "op" for e in complete) == a.op_events.height
    names = {(e["pid"], e.get("tid")): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"].endswith("_name")}
    assert names[(PID_SPANS, None)] == "Phases and modules"
    assert names[(PID_OPS, None)] == "Framework ops"
    assert names[(PID_PRIMS, None)] == "oneDNN primitives"
    assert names[(PID_SPANS, 0)] == "phases"


def test_primitives_sit_inside_their_ops(tmp_path):
    run = make_run(tmp_path)
    events = [e for e in load(write_trace(run))["traceEvents"] if e["ph"] == "X"]
    convs = [e for e in events if e["cat"] == "op" and e["name"] == "aten::mkldnn_convolution"]
    fwd = [e for e in events if e["cat"] == "primitive" and e["name"] == "conv FWD_B"]
    assert len(convs) == len(fwd) > 0
    for op, prim in zip(sorted(convs, key=lambda e: e["ts"]), sorted(fwd, key=lambda e: e["ts"])):
        assert op["ts"] <= prim["ts"] and prim["ts"] + prim["dur"] <= op["ts"] + op["dur"] + 1e-3
        assert prim["args"]["module"] == op["args"]["module"]


def test_light_runs_trace_spans_and_primitives(tmp_path):
    data = load(write_trace(make_run(tmp_path, light=True), tmp_path / "light.json"))
    cats = {e.get("cat") for e in data["traceEvents"] if e["ph"] == "X"}
    assert cats == {"phase", "module", "primitive"}


def test_log_needs_an_explicit_trace_path(tmp_path):
    from pathlib import Path

    log = Path(__file__).parent / "fixtures" / "verbose" / "torch2.14_onednn3.12_small.log"
    with pytest.raises(RunError, match="give the trace an output path"):
        write_trace(log)
    data = load(write_trace(log, tmp_path / "log.json"))
    assert {e["cat"] for e in data["traceEvents"] if e["ph"] == "X"} == {"primitive"}

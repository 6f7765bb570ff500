"""Line classes: info, template, graph, error/warning, dispatch, markers and foreign
output are counted and kept out of the table; malformed lines are reported with their
line numbers; the physical line number of every row is kept."""

from __future__ import annotations

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from profilednn.errors import NoPrimitivesError
from profilednn.verbose import read_log, read_log_with_report, scan_log

EXEC = ("onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef,src:f32::blocked:abcd::f0 "
        "dst:f32::blocked:Acdb8a::f0,attr-scratchpad:user,,8x3x3x3,0.25")
CONV = ("onednn_verbose,primitive,exec,cpu,convolution,jit:avx2,forward_training,src_f32::blocked:abcd::f0 "
        "wei_f32::blocked:Acdb8a::f0 bia_f32::blocked:a::f0 dst_f32::blocked:aBcd8b::f0,attr-scratchpad:user,"
        "alg:convolution_direct,mb2_ic3oc8_ih16oh16kh3sh1dh0ph1_iw16ow16kw3sw1dw0pw1,0.5")


def test_each_line_class_is_counted_and_kept_out_of_the_table():
    lines = [
        "onednn_verbose,v1,info,oneDNN v3.12.0 (commit 80afa71049cd69a3df32adcccb623b12cd7baa22)",
        "onednn_verbose,v1,primitive,info,template:timestamp,operation,engine,primitive,implementation",
        "onednn_verbose,info,prim_template:operation,engine,primitive,implementation,prop_kind",
        "onednn_verbose,v1,graph,info,template:operation,engine,partition_id",
        "onednn_verbose,v1,graph,exec,cpu,100002,sdp,matmul;softmax;matmul,,in0_f32:0:strided,fpmath:strict,dnnl_backend,1.5",
        "onednn_graph_verbose,exec,cpu,100002,sdp,matmul,,in0,fpmath:strict,dnnl_backend,1.5",
        "onednn_verbose,v1,common,error,cpu,runtime error: unable to create a primitive",
        "onednn_verbose,v1,common,warn,cpu,runtime,unknown environment variable",
        "onednn_verbose,v1,primitive,create:dispatch,convolution,unsupported format tag,src/x.cpp:1",
        "onednn_verbose,create:check,matmul,dimension src:1 is inconsistent with weights:0,src/common/matmul.cpp:144",
        "onednn_verbose,v1,primitive,exec:check,primitive,unused primitive execution argument (80),src/x.cpp:136",
        "profilednn_mark,module,layer1.0.conv1,forward,begin",
        "Epoch 1/10 loss=0.25",
        "",
        EXEC,
    ]
    df, r = read_log_with_report(lines)
    assert df["line"].to_list() == [15]
    assert r.lines == 15
    assert (r.counts["info"], r.counts["template"], r.counts["graph"], r.counts["error"]) == (1, 2, 3, 2)
    assert (r.counts["dispatch"], r.counts["marker"], r.counts["foreign"], r.counts["primitive"]) == (3, 1, 2, 1)
    assert r.counts["malformed"] == 0
    assert sum(r.counts.values()) == r.lines


def test_markers_are_skipped_not_malformed_and_line_numbers_stay_physical():
    lines = []
    for step in range(3):
        lines.append(f"profilednn_mark,step,{step},begin")
        lines.append(EXEC)
        lines.append(f"profilednn_mark,module,conv,{step},forward,begin")
        lines.append(CONV)
    df, r = read_log_with_report(lines)
    assert r.counts["marker"] == 6 and r.counts["malformed"] == 0 and r.counts["foreign"] == 0
    assert df["line"].to_list() == [2, 4, 6, 8, 10, 12]
    assert df["driver"].to_list() == ["reorder", "conv"] * 3


def test_launcher_prefixes_and_glued_output_still_find_the_marker():
    lines = ["[default0]:" + EXEC, "[1,0]<stdout>:" + CONV, "progress 50% " + EXEC]
    df = read_log(lines)
    assert df["line"].to_list() == [1, 2, 3]
    assert df["driver"].to_list() == ["reorder", "conv", "reorder"]


def test_malformed_lines_are_counted_with_line_numbers_and_reasons():
    lines = [
        EXEC,
        "onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef",            # fields missing
        EXEC.rsplit(",", 1)[0] + ",not-a-time",                                  # time not a number
        "onednn_verbose,v1,primitive,exec,cpu,Bad Kind!,jit:uni,undef,src:f32::blocked:a::f0,,,8,0.1",
        "onednn_verbose,v1,primitive,exec,weird engine,reorder,jit:uni,undef,src:f32::blocked:a::f0,,,8,0.1",
        CONV,
    ]
    df, r = read_log_with_report(lines)
    assert df["line"].to_list() == [1, 6]
    assert r.counts["malformed"] == 4
    assert [i.line for i in r.malformed] == [2, 3, 4, 5]
    reasons = {i.line: i.reason for i in r.malformed}
    assert "expected 9 fields" in reasons[2]
    assert "not a number" in reasons[3]
    assert "primitive kind" in reasons[4]
    assert "engine" in reasons[5]
    assert r.malformed[0].text.startswith("onednn_verbose,v1,primitive,exec,cpu,reorder")
    assert "4 malformed (line 2:" in r.summary()


def test_extra_trailing_fields_use_the_time_at_its_position():
    df, r = read_log_with_report([EXEC + ",17,trailing", EXEC])
    assert df["time_ms"].to_list() == [0.25, 0.25]
    assert r.notes == {"extra_fields": 1} and r.note_examples[0].line == 1


def test_missing_trailing_time_field_is_malformed():
    df, r = read_log_with_report([EXEC, EXEC.rsplit(",", 1)[0]])
    assert df.height == 1 and r.counts["malformed"] == 1 and r.malformed[0].line == 2


def test_undecodable_problem_keeps_the_row_with_null_fields():
    bad = CONV.replace("mb2_ic3oc8_ih16", "mb2_ic3oc8_iQ16")
    df, r = read_log_with_report([bad])
    row = df.to_dicts()[0]
    assert row["driver"] == "conv" and row["time_ms"] == 0.5 and row["mb"] is None and row["flops"] is None
    assert r.notes == {"undecoded_problem": 1}


def test_create_events_are_rows_and_carry_creation_time():
    create = EXEC.replace(",exec,", ",create:cache_miss,")
    hit = EXEC.replace(",exec,", ",create:cache_hit,")
    df, r = read_log_with_report([create, hit, EXEC])
    assert df["event"].to_list() == ["create:cache_miss", "create:cache_hit", "exec"]
    assert r.events == {"create:cache_miss": 1, "create:cache_hit": 1, "exec": 1}


def test_only_non_primitive_lines_raise_no_primitives_with_the_summary():
    with pytest.raises(NoPrimitivesError, match="no oneDNN primitive line.*2 foreign.*ONEDNN_VERBOSE"):
        read_log(["hello", "world"])
    log = scan_log(["hello"])
    assert log.table().height == 0 and log.table().schema == read_log([EXEC]).schema


def test_timestamps_parse_and_lines_without_them_are_null():
    with_ts = EXEC.replace("v1,primitive", "v1,1700000000123.250000,primitive")
    df = read_log([with_ts, EXEC])
    assert df["timestamp_ms"].to_list() == [1700000000123.25, None]
    assert df.select(pl.col("dialect").unique()).item() == "onednn_v3.6"


def test_report_is_json_ready_and_progress_sees_every_byte(tmp_path):
    import json

    path = tmp_path / "log.txt"
    path.write_text("\n".join([EXEC, CONV, "noise"] * 50) + "\n")
    seen: list[int] = []
    log = scan_log(path, chunk_bytes=1000, progress=seen.append)
    assert sum(seen) == path.stat().st_size and len(seen) > 5
    data = json.loads(json.dumps(log.report.to_dict()))
    assert data["counts"]["primitive"] == 100 and data["counts"]["foreign"] == 50
    assert data["dialects"] == {"onednn_v3.6": 50, "onednn_v3.3": 50}


def test_the_verbose_layer_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, profilednn.verbose, profilednn.cli.verbs_verbose; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_allow_empty_returns_an_empty_table_and_the_report():
    df, report = read_log_with_report(["profilednn_mark,step,0", "noise"], allow_empty=True)
    assert df.height == 0 and df.schema == read_log([EXEC]).schema
    assert report.counts["marker"] == 1 and report.counts["foreign"] == 1
    assert read_log([], allow_empty=True).height == 0


_FUZZ_PREFIXES = ["onednn_verbose,", "onednn_verbose,v1,primitive,exec,", "dnnl_verbose,exec,cpu,",
                  "mkldnn_verbose,exec,", "onednn_verbose,v1,123.5,", "", "profilednn_mark,"]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_FUZZ_PREFIXES),
                          st.text(alphabet=st.sampled_from(list("abc_:,x0123456789. \t-*?") + ["\x00", "é"]),
                                  max_size=80)),
                min_size=1, max_size=12))
def test_arbitrary_lines_never_crash_and_every_line_is_classified(pairs):
    lines = [prefix + body for prefix, body in pairs]
    df, report = read_log_with_report(lines, allow_empty=True)
    assert sum(report.counts.values()) == report.lines == len(lines)
    assert df.height == report.counts["primitive"]
    assert df["line"].is_unique().all() and all(1 <= n <= len(lines) for n in df["line"])


def test_non_finite_times_and_absurd_dimensions_are_handled():
    nan_time = EXEC.rsplit(",", 1)[0] + ",nan"
    huge = CONV.replace("mb2_ic3", "mb" + "9" * 300 + "_ic3")
    df, r = read_log_with_report([nan_time, EXEC.rsplit(",", 1)[0] + ",inf", huge])
    assert df["line"].to_list() == [3] and df["mb"].to_list() == [None]
    assert r.counts["malformed"] == 2 and r.notes == {"undecoded_problem": 1}

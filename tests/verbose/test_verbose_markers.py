"""ProfileDNN's marker lines: what the writer writes, the reader reads back in line order
among oneDNN's lines, and the verbose parser counts as markers (one format, one place)."""

from __future__ import annotations

import os

from profilednn.verbose import read_log_with_report
from profilednn.verbose.markers import (
    REPLAY_EVENT,
    format_marker,
    is_marker_line,
    read_markers,
    write_marker,
)

EXEC = ("onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef,src:f32::blocked:abcd::f0 "
        "dst:f32::blocked:Acdb8a::f0,attr-scratchpad:user,,8x3x3x3,0.25")


def test_written_markers_read_back_with_their_lines_times_and_events(tmp_path):
    log = tmp_path / "verbose.log"
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        write_marker("step_end,3", fd)
        os.write(fd, (EXEC + "\n").encode())
        os.write(fd, format_marker(f"{REPLAY_EVENT},conv_1@0,timed", time_ms=1234.5))
        os.write(fd, b"profilednn_mark,not-a-time,step_end,4\n")  # the prefix without a time: not a marker
    finally:
        os.close(fd)
    markers = read_markers(log)
    assert [(m.line, m.event, m.args) for m in markers] == [
        (1, "step_end", ["3"]), (3, REPLAY_EVENT, ["conv_1@0", "timed"])]
    assert markers[0].time_ms > 1e12 and markers[1].time_ms == 1234.5  # Unix ms; the given stamp kept
    assert [m.line for m in read_markers(log, REPLAY_EVENT)] == [3]


def test_the_parser_counts_written_markers_and_keeps_them_out_of_the_table():
    lines = [format_marker("win_open,0").decode().rstrip("\n"), EXEC,
             format_marker(f"{REPLAY_EVENT},x@1,end").decode().rstrip("\n")]
    df, report = read_log_with_report(lines)
    assert df.height == 1 and report.counts["marker"] == 2
    assert is_marker_line(lines[0]) and is_marker_line(lines[2].encode()) and not is_marker_line(EXEC)

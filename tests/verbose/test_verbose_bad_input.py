"""Bad and awkward input: each case has a defined result and never a crash."""

from __future__ import annotations

import gzip
import io
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from profilednn.errors import InputError, NoPrimitivesError
from profilednn.verbose import read_log, read_log_with_report
from profilednn.verbose.source import iter_chunks
from verbose_helpers import FIXTURES

SMALL = FIXTURES / "torch2.14_onednn3.12_small.log"


def test_empty_file_raises_no_primitives(tmp_path: Path):
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    with pytest.raises(NoPrimitivesError, match="empty"):
        read_log(empty)


def test_missing_file_and_directory_raise_input_error(tmp_path: Path):
    with pytest.raises(InputError, match="no such file"):
        read_log(tmp_path / "nope.log")
    with pytest.raises(InputError, match="directory"):
        read_log(tmp_path)


def test_binary_garbage_is_foreign_output(tmp_path: Path):
    rng = random.Random(7)
    junk = tmp_path / "junk.bin"
    junk.write_bytes(bytes(rng.randrange(256) for _ in range(200_000)))
    with pytest.raises(NoPrimitivesError) as err:
        read_log(junk)
    report = err.value.report
    assert report.counts["foreign"] == report.lines > 0 and report.replaced_utf8


def test_non_utf8_bytes_are_replaced_and_primitives_still_read(tmp_path: Path):
    data = SMALL.read_bytes().replace(b"PyTorch built with:", b"PyTorch \xff\xfe built with:")
    data = b"caf\xe9 latin-1 line\n" + data
    path = tmp_path / "latin.log"
    path.write_bytes(data)
    df, report = read_log_with_report(path)
    assert report.replaced_utf8
    assert df.height == read_log(SMALL).height
    assert df["line"].to_list() == [n + 1 for n in read_log(SMALL)["line"].to_list()]


def test_crlf_line_endings_parse_like_lf(tmp_path: Path):
    path = tmp_path / "crlf.log"
    path.write_bytes(SMALL.read_bytes().replace(b"\n", b"\r\n"))
    crlf, lf = read_log(path), read_log(SMALL)
    assert crlf.equals(lf)


def test_truncated_last_line(tmp_path: Path):
    text = SMALL.read_text()
    lines = text.splitlines()
    last_exec = max(i for i, line in enumerate(lines) if ",exec,cpu," in line)
    cut_inside_time = "\n".join(lines[: last_exec + 1])[:-3]  # "0.00195312" -> "0.001953" ... no newline
    path = tmp_path / "cut.log"
    path.write_text(cut_inside_time)
    df, report = read_log_with_report(path)
    assert report.missing_final_newline
    assert df["line"].max() == last_exec + 1  # the cut line still parses (its time is shorter)
    cut_inside_problem = "\n".join(lines[: last_exec + 1])[:-25]
    path.write_text(cut_inside_problem)
    df2, report2 = read_log_with_report(path)
    assert report2.counts["malformed"] == 1 and report2.malformed[0].line == last_exec + 1
    assert df2.height == df.height - 1


def test_gzip_is_detected_by_content_not_name(tmp_path: Path):
    path = tmp_path / "log.txt"  # no .gz suffix on purpose
    path.write_bytes(gzip.compress(SMALL.read_bytes()))
    assert read_log(path).equals(read_log(SMALL))


def test_corrupt_gzip_raises_input_error(tmp_path: Path):
    path = tmp_path / "bad.gz"
    path.write_bytes(gzip.compress(SMALL.read_bytes())[:300])
    with pytest.raises(InputError, match="cannot read"):
        read_log(path)


def test_bytes_lines_and_file_objects_are_sources():
    data = SMALL.read_bytes()
    ref = read_log(SMALL)
    assert read_log(data).equals(ref)
    assert read_log(io.BytesIO(data)).equals(ref)
    assert read_log(data.decode().splitlines(keepends=True)).equals(ref)
    with pytest.raises(InputError):
        read_log([b"bytes are not lines"])  # type: ignore[list-item]


@pytest.mark.parametrize("chunk_bytes", [1, 7, 100, 1000, 4096])
def test_tiny_chunks_give_the_same_table(chunk_bytes: int):
    ref, ref_report = read_log_with_report(SMALL)
    df, report = read_log_with_report(SMALL, chunk_bytes=chunk_bytes, threads=2)
    assert df.equals(ref)
    assert report.counts == ref_report.counts


def test_chunks_cut_only_at_line_ends_and_count_every_line():
    data = SMALL.read_bytes()
    chunks = list(iter_chunks(data, chunk_bytes=500))
    assert len(chunks) > 5
    assert b"".join(c.text for c in chunks) == data
    assert all(c.text.endswith(b"\n") for c in chunks[:-1])
    assert all(c.data[c.size:] == bytes(len(c.data) - c.size) for c in chunks)  # zero padding


def test_an_overlong_line_counts_as_one_foreign_line():
    exec_line = SMALL.read_text().splitlines()[20]
    data = ("x" * 50_000 + "\n" + exec_line + "\n").encode()
    df, report = read_log_with_report(data, chunk_bytes=4096)
    assert report.lines == 2 and report.counts["foreign"] == 1
    assert df["line"].to_list() == [2]


@pytest.mark.slow
def test_large_log_streams_with_bounded_memory(tmp_path: Path):
    """~120 MB log parsed in a child process: peak RSS stays far below the log size x 3."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from bench_parse import write_log

    log = tmp_path / "big.log"
    size = write_log(log, 500_000, seed=3)
    code = textwrap.dedent(
        """
        import re, sys
        from profilednn.verbose import scan_log, breakdown
        log = scan_log(sys.argv[1], chunk_bytes=4 * 2**20)
        bd = breakdown(log)
        # VmHWM is this process's own peak; ru_maxrss would carry the forking parent's over exec.
        hwm_kb = int(re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read()).group(1))
        print(int(bd["ncalls"].sum()), hwm_kb // 1024)
        """
    )
    out = subprocess.run([sys.executable, "-c", code, str(log)], capture_output=True, text=True, check=True)
    ncalls, rss_mb = map(int, out.stdout.split())
    assert ncalls > 450_000
    assert rss_mb < 450, f"peak RSS {rss_mb} MB for a {size / 2**20:.0f} MB log"
    os.unlink(log)

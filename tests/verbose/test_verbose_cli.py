"""``profilednn parse`` and ``profilednn breakdown``: outputs and exit codes (0, 1, 2)."""

from __future__ import annotations

import gzip
import io
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from profilednn.cli import run_cli
from profilednn.verbose import PRIMITIVE_SCHEMA, parse_batch, read_log
from verbose_helpers import FIXTURES

SMALL = FIXTURES / "torch2.14_onednn3.12_small.log"


def test_parse_writes_parquet_and_csv(tmp_path: Path, capsys):
    out = tmp_path / "prims.parquet"
    assert run_cli(["parse", str(SMALL), "-o", str(out)]) == 0
    table = pl.read_parquet(out)
    assert table.schema == pl.Schema(PRIMITIVE_SCHEMA)
    assert table.equals(read_log(SMALL))
    err = capsys.readouterr().err
    assert "58 lines, 14 primitive" in err and "24 dispatch" in err
    csv_out = tmp_path / "prims.csv"
    assert run_cli(["parse", str(SMALL), "-o", str(csv_out)]) == 0
    assert pl.read_csv(csv_out).height == 14


def test_parse_to_stdout_as_csv_and_benchdnn(capsys):
    assert run_cli(["parse", str(SMALL)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("line,dialect,event,engine,driver,")
    assert len(out.splitlines()) == 15
    assert run_cli(["parse", str(SMALL), "--format", "benchdnn"]) == 0
    lines = parse_batch(capsys.readouterr().out)
    assert sum(b.calls for b in lines) == 7 and lines[0].driver == "conv"


def test_parse_reads_gzip_and_stdin(tmp_path: Path):
    gz = tmp_path / "log.gz"
    gz.write_bytes(gzip.compress(SMALL.read_bytes()))
    assert run_cli(["parse", str(gz), "-o", str(tmp_path / "a.parquet")]) == 0
    proc = subprocess.run(
        [sys.executable, "-m", "profilednn", "parse", "-", "-f", "benchdnn"],
        input=gzip.compress(SMALL.read_bytes()), capture_output=True, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode().count("--reorder") == 5


def test_breakdown_table_and_csv(capsys):
    assert run_cli(["breakdown", str(SMALL)]) == 0
    out = capsys.readouterr().out
    assert "conv" in out and "FWD_B" in out and "58.3%" in out
    assert run_cli(["breakdown", str(SMALL), "--by", "driver,impl", "--csv"]) == 0
    rows = pl.read_csv(io.StringIO(capsys.readouterr().out))
    assert rows.columns[:5] == ["driver", "impl", "ncalls", "time_ms", "percent"]
    assert rows["ncalls"].sum() == 7


def test_breakdown_of_a_parsed_table(tmp_path: Path, capsys):
    out = tmp_path / "t.parquet"
    assert run_cli(["parse", str(SMALL), "-o", str(out)]) == 0
    capsys.readouterr()
    assert run_cli(["breakdown", str(out), "--event", "create", "--csv"]) == 0
    rows = pl.read_csv(io.StringIO(capsys.readouterr().out))
    assert rows["ncalls"].sum() == 7  # seven create:cache_miss lines


@pytest.mark.parametrize(
    "argv",
    [
        ["parse", "{missing}"],
        ["parse", "{empty}"],
        ["parse", "{foreign}"],
        ["breakdown", "{missing}"],
        ["breakdown", "{foreign}"],
    ],
)
def test_unreadable_or_empty_input_exits_1_with_one_line(tmp_path: Path, capsys, argv):
    paths = {"missing": tmp_path / "nope.log", "empty": tmp_path / "empty.log", "foreign": tmp_path / "f.log"}
    paths["empty"].write_text("")
    paths["foreign"].write_text("just some program output\n")
    args = [a.format(**{k: str(v) for k, v in paths.items()}) for a in argv]
    assert run_cli(args) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    "argv",
    [
        ["parse"],
        ["parse", str(SMALL), "--format", "xml"],
        ["parse", str(SMALL), "--format", "parquet"],  # parquet needs -o
        ["breakdown", str(SMALL), "--by", "driver,bogus"],
        ["breakdown", str(SMALL), "--event", "run"],
        ["parse", str(SMALL), "--no-such-option"],
    ],
)
def test_usage_errors_exit_2(argv):
    assert run_cli(argv) == 2


def test_breakdown_of_a_table_without_the_key_column_exits_1(tmp_path: Path, capsys):
    out = tmp_path / "narrow.parquet"
    read_log(SMALL).select("driver", "event", "time_ms").write_parquet(out)
    assert run_cli(["breakdown", str(out), "--by", "impl"]) == 1
    assert "impl" in capsys.readouterr().err


def test_parse_to_an_unwritable_place_exits_1(tmp_path: Path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert run_cli(["parse", str(SMALL), "-o", str(blocker / "out.csv")]) == 1
    assert "cannot write" in capsys.readouterr().err

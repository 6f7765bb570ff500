"""Job tables stay readable in an 80-column terminal (essential columns, wrapped cells, no
cell cut to "…"); ``--wide`` prints every column at its natural width."""

from __future__ import annotations

import pytest
from rich.console import Console

from profilednn.cli import run_cli
from profilednn.cli.app import console as cli_console
from profilednn.formatting import FULL_TABLE_WIDTH, finite, fixed, full_tables, ms, num, pct, spec
from profilednn.optimize.abtest import Timing
from profilednn.optimize.api import OptimizeReport, RecipeResult
from profilednn.optimize.terminal import print_recipes
from profilednn.projection import MachineProfile, Measurement
from profilednn.projection.machine import cached_machine_path
from runfactory import make_run

MACHINE = MachineProfile(name="cached box", cpu_model="cached", cores=2,
                         gemm={"fp32": {1: Measurement.of([90.0]), 2: Measurement.of([180.0])}},
                         bandwidth={2: Measurement.of([30.0])})


def _header(out: str, first: str) -> list[str]:
    """The column names of the table whose header row starts with ``first``."""
    line = next(ln for ln in out.splitlines() if ln.startswith("┃") and ln.strip("┃ ").startswith(first))
    return [cell.strip() for cell in line.strip("┃").split("┃")]


def _table_lines(out: str) -> list[str]:
    """The rows, rules and borders of the tables (summary lines soft-wrap in the terminal)."""
    return [line for line in out.splitlines() if line[:1] in set("┏┃┡│└")]


def _fits(out: str, width: int) -> None:
    lines = _table_lines(out)
    assert lines and max(len(line) for line in lines) <= width
    assert not any("…" in line for line in lines)  # nothing cut: long cells fold onto more lines


@pytest.fixture
def narrow(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's console as an 80-column terminal."""
    monkeypatch.setattr(cli_console, "width", 80)


@pytest.fixture
def projected_run(tmp_path, monkeypatch):
    monkeypatch.setenv("PROFILEDNN_CACHE_DIR", str(tmp_path / "cache"))
    MACHINE.save(cached_machine_path())
    return make_run(tmp_path / "runs")


def test_project_fits_80_columns_and_wide_shows_every_column(projected_run, narrow, capsys):
    assert run_cli(["project", str(projected_run.path), "--no-replay", "--top", "4"]) == 0
    out = capsys.readouterr().out
    _fits(out, 80)
    assert _header(out, "item") == ["item", "in_situ_ms", "replay_ms", "bound"]
    assert _header(out, "part") == ["part", "in_situ_ms", "projected_ms", "assumption"]
    assert "mb4_ic16oc90" in out.replace("\n", "")  # the folded problem descriptor, whole

    assert run_cli(["project", str(projected_run.path), "--no-replay", "--top", "4", "--wide"]) == 0
    wide = capsys.readouterr().out
    assert _header(wide, "item") == ["item", "calls", "in_situ_ms", "replay_ms", "attainable_ms", "bound",
                                     "impl"]
    assert _header(wide, "part") == ["part", "in_situ_ms", "projected_ms", "calls", "us_per_call",
                                     "assumption"]
    assert max(len(line) for line in _table_lines(wide)) > 80
    assert cli_console.width == 80  # --wide widens one table at a time, not the console


def _report() -> OptimizeReport:
    long_reason = ("the model has no BatchNorm layer in eval mode and no frozen parameters, so there is "
                   "nothing to fold or skip")
    recipes = [
        RecipeResult("channels_last", "layout", True, "", accepted=True, decision="model and inputs to "
                     "channels_last (NHWC) memory format", before_ms=112.5, after_ms=95.25, speedup=1.181,
                     numerics="pass", loss_max_rel_diff=3e-7, grad_rel_diff=2e-6),
        RecipeResult("frozen_batchnorm", "frozen", False, long_reason),
        RecipeResult("fused_optimizer", "optimizer", True, "", decision="SGD(foreach=True)", before_ms=95.25,
                     after_ms=95.0, speedup=1.003, numerics="pass", loss_max_rel_diff=0.0, grad_rel_diff=0.0),
    ]
    return OptimizeReport(workload="small_cnn", recipes=recipes, accepted=["channels_last"], environment={},
                          baseline=Timing((112.0, 113.0)), final=Timing((95.0, 95.5)), threads=2)


@pytest.mark.parametrize("width", [80, 100])
def test_optimize_table_fits_a_narrow_terminal(width):
    console = Console(width=width, record=True, markup=False)
    print_recipes(_report(), console)
    out = console.export_text()
    _fits(out, width)
    assert _header(out, "recipe") == ["recipe", "speedup", "numerics", "accepted", "why / how"]
    cells = " ".join(line.rstrip("│").rsplit("│", 1)[-1].strip() for line in _table_lines(out))
    assert "there is nothing to fold or skip" in cells  # the why / how cell, wrapped, whole
    assert "stock 112.5 ms -> optimized 95.2 ms" in out


def test_optimize_table_wide_and_in_a_wide_terminal_has_every_column():
    full = ["recipe", "applies", "before ms", "after ms", "speedup", "numerics", "accepted", "why / how"]
    narrow = Console(width=80, record=True, markup=False)
    print_recipes(_report(), narrow, wide=True)
    out = narrow.export_text()
    assert _header(out, "recipe") == full and "(loss 3.0e-07, grad 2.0e-06)" in out
    roomy = Console(width=FULL_TABLE_WIDTH, record=True, markup=False)
    print_recipes(_report(), roomy)
    assert _header(roomy.export_text(), "recipe") == full


def test_full_tables_follows_the_terminal_width_and_wide():
    assert not full_tables(Console(width=FULL_TABLE_WIDTH - 1))
    assert full_tables(Console(width=FULL_TABLE_WIDTH - 1), wide=True)
    assert full_tables(Console(width=FULL_TABLE_WIDTH))


def test_the_optimize_verb_takes_wide(narrow, capsys):
    assert run_cli(["optimize", "--help"]) == 0
    assert "--wide" in capsys.readouterr().out


def test_the_shared_number_formats():
    assert (num(None), num(3.14159), num(1234.56), num(7)) == ("n/a", "3.142", "1,234.6", "7")
    assert (fixed(None), fixed(1234.5), fixed(2.0, 1), fixed("x")) == ("", "1,234.50", "2.0", "x")
    assert (ms(None), ms(12.345), ms(95.25, 1), ms(1500.0, seconds=True)) == ("n/a", "12.35 ms", "95.2 ms", "1.50 s")
    assert (pct(None), pct(0.1234), spec(None, ".1f"), spec(2.25, ".1f")) == ("n/a", "12.3%", "", "2.2")
    assert finite({"a": [float("inf"), 1.0], "b": float("nan")}) == {"a": ["inf", 1.0], "b": "nan"}

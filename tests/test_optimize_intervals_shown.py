"""Issue 43: every A/B is a sequential test with an interval, and the terminal, the Run's
table and the HTML report show it: the speedup's interval, "inconclusive" where it straddled
the bar, the measured gain's interval, the total's interval and the A-vs-A noise. Rows of
an older Run (no interval, no outcome) still print."""

from __future__ import annotations

import math

import polars as pl
import pytest
from rich.console import Console

from profilednn.optimization.abtest import Timing
from profilednn.optimization.intervals import (
    INTERVAL_COLUMNS,
    gain_interval,
    gain_pct,
    interval_columns,
    measured_gain_ci,
    noise_line,
    outcome,
    speedup_interval,
)
from profilednn.optimization.report import report_sections
from profilednn.optimization.results import OptimizeReport, RecipeResult
from profilednn.optimization.sequential import Noise, bounds_text, interval, ratio_text
from profilednn.optimization.terminal import print_recipes, print_summary
from profilednn.run import create_run
from profilednn.tables import OPTIMIZE_RECIPES

NOISE = Noise(ss=9 * 0.01 ** 2, df=9)
NOISE_LINE = ("A-vs-A noise: one round of a setup against itself lands within ±2.0% in 95% of rounds "
              "(9 rounds)")


def _recipes() -> list[RecipeResult]:
    accepted = RecipeResult(
        "channels_last", "layout", True, "", accepted=True, before_ms=112.5, after_ms=98.5, speedup=1.142,
        decision="accepted: 1.142x [1.080-1.210] (112.5 -> 98.5 ms median, 8 rounds, faster in 100%); numerics pass",
        numerics="pass", loss_max_rel_diff=3e-7, grad_rel_diff=2e-6, speedup_ci=[1.08, 1.21], rounds=8,
        estimated_gain_pct=15.0, measured_gain_pct=gain_pct(1.142))
    straddles = RecipeResult(
        "fused_optimizer", "optimizer", True, "", before_ms=98.5, after_ms=97.9, speedup=1.006,
        decision="inconclusive: 1.006x [0.981-1.032] (98.5 -> 97.9 ms median, 12 rounds, faster in 58%): the "
                 "interval still straddles the 1.02x needed; more rounds (--rounds) or a longer --time-budget "
                 "would decide it; numerics pass",
        numerics="pass", loss_max_rel_diff=0.0, grad_rel_diff=0.0, speedup_ci=[0.981, 1.032], rounds=12)
    skipped = RecipeResult("frozen_batchnorm", "frozen", False, "no BatchNorm in eval mode",
                           decision="skipped: no BatchNorm in eval mode")
    return [accepted, straddles, skipped]


def _report() -> OptimizeReport:
    return OptimizeReport(workload="small_cnn", recipes=_recipes(), accepted=["channels_last"], environment={},
                          baseline=Timing((112.0, 113.0)), final=Timing((98.0, 99.0)), threads=2,
                          speedup_ci=[1.11, 1.17], total_speedup=1.14, a_vs_a=NOISE.to_dict(),
                          settings={"min_speedup": 1.02})


def _printed(width: int, wide: bool = False) -> str:
    console = Console(width=width, record=True, markup=False)
    print_recipes(_report(), console, wide=wide)
    return console.export_text()


def _column(out: str, header: str) -> str:
    """The recipe table's column ``header``: its non-empty cell lines, top to bottom, joined
    by a space (a cell folded onto more lines reads whole)."""
    head = next(line for line in out.splitlines() if line.startswith("┃") and "recipe" in line)
    index = [c.strip() for c in head.split("┃")].index(header)
    cells = ([c.strip() for c in line.split("│")][index] for line in out.splitlines() if line.startswith("│"))
    return " ".join(c for c in cells if c)


# ----------------------------------------------------------------------------- the figures
def test_the_measured_gains_interval_is_the_gain_at_the_speedups_bounds():
    lo, hi = measured_gain_ci([1.08, 1.21])
    assert lo == pytest.approx(100 * (1 - 1 / 1.08)) and hi == pytest.approx(100 * (1 - 1 / 1.21))
    assert measured_gain_ci([0.9, 1.1])[0] < 0 < measured_gain_ci([0.9, 1.1])[1]  # a slower bound saves less than 0
    assert measured_gain_ci(None) is None
    row = _recipes()[0].to_dict()
    assert speedup_interval(row) == (1.08, 1.21) and gain_interval(row) == pytest.approx((lo, hi))
    columns = interval_columns(row)
    assert columns == pytest.approx({"speedup_lo": 1.08, "speedup_hi": 1.21, "measured_gain_lo": lo,
                                     "measured_gain_hi": hi})
    assert interval_columns(_recipes()[2].to_dict()) == dict.fromkeys(columns)  # no A/B: no interval
    assert speedup_interval({"speedup_lo": 1.0, "speedup_hi": math.nan}) is None


def test_the_outcome_is_read_from_the_row_or_from_an_older_rows_decision():
    rows = [r.to_dict() for r in _recipes()]
    assert [outcome(r) for r in rows] == ["accepted", "inconclusive", "skipped"]
    old = {k: v for k, v in rows[1].items() if k != "outcome"}
    assert outcome(old) == "inconclusive" and outcome({"accepted": True, "decision": "SGD(foreach=True)"}) == "accepted"
    assert outcome({"accepted": False, "decision": "SGD(foreach=True)"}) == ""


def test_the_noise_line_is_the_searchs_own_sentence():
    assert noise_line(NOISE.to_dict()) == NOISE.describe() == NOISE_LINE
    assert noise_line(None) is None
    assert noise_line(Noise().to_dict()) == "A-vs-A noise: not measured"


# ----------------------------------------------------------------------------- the terminal
@pytest.mark.parametrize(("width", "wide"), [(80, False), (100, False), (160, False), (80, True)])
def test_the_terminal_shows_each_interval_inconclusive_and_the_noise(width, wide):
    out = _printed(width, wide)
    assert "…" not in out
    if not wide:
        assert max(len(line) for line in out.splitlines() if line[:1] in set("┏┃┡│└")) <= width
    else:  # every column, each interval on the speedup's line
        assert "│ 1.142x [1.08-1.21] │" in out and _column(out, "applies") == "yes yes no"
    assert _column(out, "speedup") == "1.142x [1.08-1.21] 1.006x [0.98-1.03]"  # the skipped recipe's is empty
    assert _column(out, "accepted") == "yes inconclusive no"
    flat = out.replace("\n", " ")
    assert "stock 112.5 ms -> optimized 98.5 ms per step (median; interleaved): 1.14x [1.11-1.17]" in flat
    assert NOISE_LINE in flat
    lo, hi = measured_gain_ci([1.08, 1.21])
    assert f"channels_last 15.0% -> {gain_pct(1.142):.1f}% [{lo:.1f} to {hi:.1f}%]" in flat


def test_inconclusive_is_yellow():
    console = Console(width=160, record=True, force_terminal=True, color_system="truecolor")
    print_recipes(_report(), console)
    styled = console.export_text(styles=True)
    yellow = next(line for line in styled.splitlines() if "fused_optimizer" in line)
    assert "\x1b[33minconclusive" in yellow


OLD_DECISIONS = {  # as an optimize before issue 43 wrote them (medians, a fixed number of rounds)
    "channels_last": "accepted: 1.142x (112.5 -> 98.5 ms median, faster in 100% of rounds); numerics pass",
    "fused_optimizer": "rejected: below the 1.02x needed: 1.006x (98.5 -> 97.9 ms median, faster in 60% of "
                       "rounds); numerics pass",
}


def _old_rows() -> list[dict]:
    new_keys = {"speedup_ci", "rounds", "outcome", *INTERVAL_COLUMNS}
    rows = [{k: v for k, v in r.to_dict().items() if k not in new_keys} for r in _recipes()]
    for row in rows:
        row["decision"] = OLD_DECISIONS.get(row["recipe"], row["decision"])
    return rows


def test_an_older_runs_rows_and_summary_still_print():
    summary = {k: v for k, v in _report().to_dict().items() if k not in ("speedup_ci", "a_vs_a")}
    summary["speedup"] = 112.5 / 98.5
    console = Console(width=100, record=True, markup=False)
    print_summary("small_cnn", _old_rows(), summary, console)
    out = console.export_text()
    assert _column(out, "speedup") == "1.142x 1.006x" and _column(out, "accepted") == "yes no no"
    assert "[" not in out and "A-vs-A" not in out and "inconclusive" not in out
    assert "stock 112.5 ms -> optimized 98.5 ms per step (median; interleaved): 1.14x\n" in out
    assert "channels_last 15.0% -> 12.4%\n" in out


# ----------------------------------------------------------------------------- the Run and its HTML
def _run_html(tmp_path, frame: pl.DataFrame, summary: dict) -> str:
    with create_run(tmp_path, label="optimize-small_cnn", workload={"name": "small_cnn"}, kind="optimize") as run:
        run.write_table(OPTIMIZE_RECIPES, frame)
        run.set_status("complete", optimize=summary, steps=2)
    (section,) = report_sections(run)
    return section.html


def test_the_runs_table_holds_the_interval_rounds_and_outcome(tmp_path):
    table = _report().table()
    assert table.schema == pl.Schema(OPTIMIZE_RECIPES.schema)
    rows = {r["recipe"]: r for r in table.to_dicts()}
    assert rows["channels_last"]["speedup_lo"] == 1.08 and rows["channels_last"]["speedup_hi"] == 1.21
    assert rows["channels_last"]["measured_gain_lo"] == pytest.approx(100 * (1 - 1 / 1.08))
    assert rows["fused_optimizer"]["rounds"] == 12 and rows["fused_optimizer"]["outcome"] == "inconclusive"
    assert rows["frozen_batchnorm"]["speedup_lo"] is None and rows["frozen_batchnorm"]["outcome"] == "skipped"
    console = Console(width=100, record=True, markup=False)
    print_summary("small_cnn", table.to_dicts(), _report().to_dict(), console)  # a Run's rows print as the verb's
    out = console.export_text()
    assert _column(out, "speedup") == "1.142x [1.08-1.21] 1.006x [0.98-1.03]"
    assert _column(out, "accepted") == "yes inconclusive no"


def test_the_html_section_shows_the_intervals_the_outcome_and_the_noise(tmp_path):
    html = _run_html(tmp_path, _report().table(), _report().to_dict())
    assert "1.14x [1.11-1.17]" in html  # the speedup card
    assert "1.08 to 1.21x" in html and "0.98 to 1.03x" in html  # the interval column
    lo, hi = measured_gain_ci([1.08, 1.21])
    assert f"{lo:.1f} to {hi:.1f}" in html
    assert "<td>inconclusive</td>" in html and "<td>accepted</td>" in html and "<td>skipped</td>" in html
    assert all(f">{h}</th>" in html for h in ("speedup interval", "paired rounds", "measured gain interval %"))
    assert NOISE_LINE in html
    assert "<b>inconclusive</b> (not kept)" in html


def test_an_older_runs_html_section_still_renders(tmp_path):
    old = OPTIMIZE_RECIPES.frame(_old_rows()).drop(*INTERVAL_COLUMNS, "rounds", "outcome")
    summary = {k: v for k, v in _report().to_dict().items() if k not in ("speedup_ci", "a_vs_a")}
    html = _run_html(tmp_path, old, summary)
    assert "<td>accepted</td>" in html and "<td>rejected</td>" in html and "<td>skipped</td>" in html
    assert "inconclusive</td>" not in html and " to 1.21x" not in html and "A-vs-A" not in html
    assert "interleaved A/B" in html and "median step time" in html  # how it was decided then
    assert not any(f">{h}</th>" in html for h in ("paired rounds", "speedup interval", "measured gain interval %"))


def test_an_interval_that_bounds_nothing_yet_is_written_as_the_limits_it_passes(tmp_path):
    # one round against one A-vs-A round: one degree of freedom (t = 63.7 at the look's 99%); at a log
    # ratio's sd of 0.25 the bounds are 1e-7x and 8e6x (1e26x at 0.94, seen on a public script); the text
    # says they pass the limits, the Run keeps the numbers
    assert (ratio_text(6.7e26), ratio_text(1e-26), ratio_text(0.0)) == (">1000", "<0.001", "<0.001")
    assert (ratio_text(1e-26, 2), ratio_text(0.004, 2), ratio_text(0.0123, 2)) == ("<0.01", "<0.01", "0.01")
    assert (ratio_text(999.4), ratio_text(1.0), ratio_text(0.001)) == ("999.400", "1.000", "0.001")
    assert bounds_text(0.007, 114.397) == "0.007-114.397" and bounds_text(1e-26, 6.7e26, 2, " to ") == "<0.01 to >1000"
    found = interval([(100.0, 104.7)], Noise(ss=0.25 ** 2, df=1))
    assert found is not None and found.df == 1 and found.lo < 1e-6 and found.hi > 1e6
    assert found.text() == "0.955x [<0.001->1000]"
    wide = RecipeResult(
        "fused_optimizer", "optimizer", True, "", before_ms=100.0, after_ms=104.7, speedup=0.955,
        decision="inconclusive: 0.955x [<0.001->1000] (1 run)", numerics="pass", loss_max_rel_diff=0.0,
        grad_rel_diff=0.0, speedup_ci=[found.lo, found.hi], rounds=1)
    report = OptimizeReport(workload="small_cnn", recipes=[wide], accepted=[], environment={},
                            baseline=Timing((100.0, 100.0)), final=Timing((100.0, 100.0)), threads=2,
                            speedup_ci=[found.lo, found.hi], total_speedup=0.955, a_vs_a=NOISE.to_dict(),
                            settings={"min_speedup": 1.02})
    console = Console(width=160, record=True, markup=False)
    print_recipes(report, console, wide=True)
    out = console.export_text()
    assert "0.955x [<0.01->1000]" in out and "0.95x [<0.01->1000]" in out  # the recipe's and the total's
    assert f"{found.hi:.0f}" not in out and f"{found.hi:.2f}" not in out
    html = _run_html(tmp_path, report.table(), report.to_dict())
    assert "&lt;0.01 to &gt;1000x" in html and f"{found.hi:.2f}" not in html
    assert report.table()["speedup_hi"][0] == pytest.approx(found.hi)  # the table keeps the number

"""HTML reports (one self-contained file, PNGs beside it) and the report/compare/runs verbs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from profilednn import report_compare, report_run
from profilednn.cli import run_cli
from profilednn.report import Section, list_runs

from runfactory import make_run

FIXTURE_LOG = Path(__file__).parent / "fixtures" / "verbose" / "torch2.14_onednn3.12_small.log"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_self_contained(html: str) -> None:
    assert html.startswith("<!DOCTYPE html>")
    assert not re.search(r"https?://", html), "external URL in the report"
    assert not re.search(r"<(link|img|iframe)\b", html)
    assert not re.search(r"<script[^>]*\bsrc=", html)
    assert "<style>" in html and "<script>" in html


def test_run_report_is_one_offline_file_with_charts(tmp_path):
    run = make_run(tmp_path, layout="nchw", reorder_scale=4.0, frozen_bn=True)
    path = report_run(run)
    assert path == run.path / "report.html"
    html = path.read_text(encoding="utf-8")
    assert_self_contained(html)
    for title in ("Summary", "Advice", "Step", "oneDNN primitives", "Framework ops", "Layers", "Fragmentation", "Fingerprint"):
        assert f"<h2>{title}</h2>" in html
    assert html.count('<svg role="img"') == 4
    assert 'data-rule="channels_last"' in html
    assert "AMD EPYC (synthetic)" in html  # the fingerprint
    assert 'class="sortable"' in html
    pngs = sorted((run.path / "report_charts").glob("*.png"))
    assert [p.stem for p in pngs] == ["driver_direction", "layers_fwd_bwd", "step", "top_ops"]
    assert all(p.read_bytes().startswith(PNG_MAGIC) for p in pngs)
    assert (run.path / "trace.json").is_file()


def test_extra_sections_are_appended(tmp_path):
    run = make_run(tmp_path)
    path = report_run(run, tmp_path / "out" / "r.html", extra_sections=[Section("Projection", "<p>efficiency 0.42</p>")])
    html = path.read_text(encoding="utf-8")
    assert html.index("<h2>Fingerprint</h2>") < html.index("<h2>Projection</h2>")
    assert '<a href="#projection">Projection</a>' in html and "efficiency 0.42" in html
    assert (tmp_path / "out" / "r_charts" / "step.png").is_file()


def test_report_escapes_what_it_shows(tmp_path):
    run = make_run(tmp_path, workload="<script>alert(1)</script>")
    html = report_run(run).read_text(encoding="utf-8")
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_failed_run_gets_a_report_with_a_note(tmp_path):
    run = make_run(tmp_path, status="failed")
    run.update(error="RuntimeError: out of memory")
    html = report_run(run).read_text(encoding="utf-8")
    assert "the workload failed: RuntimeError: out of memory" in html


def test_bare_log_gets_a_report(tmp_path):
    log = tmp_path / "train.log"
    log.write_bytes(FIXTURE_LOG.read_bytes())
    path = report_run(log)
    assert path == tmp_path / "train.report.html"
    html = path.read_text(encoding="utf-8")
    assert_self_contained(html)
    assert "<h2>oneDNN primitives</h2>" in html and "<h2>Layers</h2>" not in html
    assert "a bare verbose log" in html
    assert not (tmp_path / "trace.json").exists()


def test_compare_report(tmp_path):
    a = make_run(tmp_path, loss="focal", num_classes=91)
    b = make_run(tmp_path, loss="focal", num_classes=264, frozen_bn=True)
    path = report_compare(a, b)
    assert path == b.path / f"compare_{a.id}.html"
    html = path.read_text(encoding="utf-8")
    assert_self_contained(html)
    for title in ("Phases", "oneDNN drivers", "Framework ops", "Layers", "Discrepancies"):
        assert f"<h2>{title}</h2>" in html
    assert html.count('<svg role="img"') == 4
    assert "FrozenBatchNorm2d" in html
    assert sorted(p.stem for p in (b.path / f"compare_{a.id}_charts").glob("*.png")) == [
        "drivers", "layers", "ops", "phases",
    ]


# ------------------------------------------------------------------------- CLI
def test_cli_report_prints_summary_and_path(tmp_path, capsys):
    run = make_run(tmp_path, threads=1)
    assert run_cli(["report", str(run.path)]) == 0
    out = capsys.readouterr().out
    assert "threads_vs_cores" in out
    assert out.strip().splitlines()[-1] == f"report: {run.path / 'report.html'}"


def test_cli_report_json(tmp_path, capsys):
    run = make_run(tmp_path, threads=1, data_ms=6.0)
    assert run_cli(["report", str(run.path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [d["rule"] for d in data] == ["threads_vs_cores", "data_loading"]
    assert set(data[0]) == {"rule", "severity", "evidence", "estimated_gain_pct", "action"}
    assert not (run.path / "report.html").exists()  # --json alone writes nothing
    assert run_cli(["report", str(run.path), "--json", "-o", str(tmp_path / "x.html")]) == 0
    assert json.loads(capsys.readouterr().out) == data
    assert (tmp_path / "x.html").is_file()


def test_cli_compare(tmp_path, capsys):
    a = make_run(tmp_path, loss="focal", num_classes=91)
    b = make_run(tmp_path, loss="focal", num_classes=264)
    out_html = tmp_path / "cmp.html"
    assert run_cli(["compare", str(a.path), str(b.path), "-o", str(out_html)]) == 0
    out = capsys.readouterr().out
    assert "B / A step time" in out and out.strip().endswith(f"report: {out_html}")
    assert run_cli(["compare", str(a.path), str(b.path), "--json"]) == 0
    rules = [d["rule"] for d in json.loads(capsys.readouterr().out)]
    assert "fused_loss" in rules


def test_cli_runs_lists_runs(tmp_path, capsys):
    make_run(tmp_path, workload="alpha")
    make_run(tmp_path, workload="beta", status="failed")
    broken = tmp_path / "zz-broken"
    broken.mkdir()
    (broken / "manifest.json").write_text("{not json")
    table = list_runs(tmp_path)
    assert table["status"].to_list() == ["complete", "failed", "unreadable"]
    assert table["median_step_ms"][0] > 0 and table["steps"][0] == 3
    assert run_cli(["runs", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "alpha" in out and "beta" in out and "unreadable" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["report", "{tmp}/missing"], "no such Run or verbose log"),
        (["report", "{tmp}"], "not a Run"),
        (["compare", "{tmp}/a", "{tmp}/b"], "no such Run or verbose log"),
        (["runs", "{tmp}/nowhere"], "no such runs directory"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_1(tmp_path, capsys, argv, message):
    assert run_cli([a.format(tmp=tmp_path) for a in argv]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cli_run_without_tables_fails_clearly(tmp_path, capsys):
    from profilednn import create_run

    run = create_run(tmp_path, label="empty")
    run.set_status("failed", error="crashed before the first step")
    assert run_cli(["report", str(run.path)]) == 1
    assert "nothing to report" in capsys.readouterr().err


def test_cli_file_that_is_not_a_log(tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("just some text\n")
    assert run_cli(["report", str(notes)]) == 1
    err = capsys.readouterr().err
    assert "no oneDNN primitive" in err and "Traceback" not in err

"""Projection end to end on a tiny captured Run; the CLI verbs and their errors."""

from __future__ import annotations

import json

import polars as pl
import pytest

from profilednn.cli import run_cli
from profilednn.projection import load_machine_file, project
from profilednn.projection.projector import load_projection
from profilednn.projection.report import report_sections
from profilednn.run import create_run
from cached_machine import cached_box, use_cached

MACHINE = cached_box(page_fault_ms_per_mib=0.2)


@pytest.fixture(autouse=True)
def cached_machine(tmp_path, monkeypatch):
    """A machine profile in the cache, so no test spends seconds measuring."""
    use_cached(monkeypatch, tmp_path / "cache", MACHINE)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from profilednn.capture import profile_builtin

    return profile_builtin("small_cnn", tmp_path_factory.mktemp("runs"), steps=1, warmup=1,
                           threads=1, batch_size=2, image_size=16)


def test_project_replays_writes_tables_and_a_report_section(tiny_run) -> None:
    assert report_sections(tiny_run) == []  # not projected yet
    proj = project(tiny_run, machine=MACHINE, budget_s=0.01)
    s = proj.summary
    assert s["threads"] == 1 and s["primitives_replayed"] == s["primitives"] > 0
    conv = proj.primitives.filter(pl.col("driver") == "conv")
    assert set(conv["direction"]) >= {"FWD_D", "BWD_D"} and conv["match"].eq("exact").all()
    assert conv["same_impl"].all()
    assert s["ops_replayed"] > 0 and s["coverage"] > 0.5
    assert s["efficiency"] == pytest.approx(s["projected_kernel_ms"] / s["measured_step_ms"])
    assert 0 < s["mfu"] < 1
    assert set(proj.by_phase["name"]) >= {"forward", "backward"}
    again = load_projection(tiny_run)
    assert again is not None and again.summary == s and again.primitives.height == proj.primitives.height
    sections = report_sections(tiny_run)
    assert len(sections) == 1 and "efficiency" in sections[0].html.lower()
    # the step model: parts add up to the measured mean step; conv calls replayed whole
    steps = tiny_run.table("steps")
    assert proj.step["in_situ_ms"].sum() == pytest.approx(steps["time_ms"].mean(), rel=1e-6)
    assert s["projected_step_ms"] == pytest.approx(proj.step["projected_ms"].sum())
    assert proj.conv_calls.height > 0 and proj.conv_calls["replay_ms"].is_not_null().all()
    assert proj.conv_calls["replay_path"].is_not_null().all()
    assert again.step.height == proj.step.height and "Step model" in sections[0].html


def test_project_cli_json_with_a_what_if(tiny_run, tmp_path, capsys) -> None:
    target = tmp_path / "big.toml"
    target.write_text('name = "big"\ncores = 8\nbandwidth_gbs = 120.0\n[peak_gflops]\nfp32 = 720.0\n')
    assert run_cli(["project", str(tiny_run.path), "--machine", str(target), "--json",
                    "--no-replay"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("measured_step_ms", "projected_kernel_ms", "efficiency", "mfu"):
        assert key in out["summary"]
    row = out["primitives"][0]
    for key in ("in_situ_ms", "replay_ms", "flops", "bytes", "attainable_ms"):
        assert key in row
    w = out["whatif"]["summary"]
    assert w["target_machine"] == "big" and w["target_threads"] == 8
    assert w["whatif_step_ms"] < w["measured_step_ms"]
    assert out["summary"]["projected_step_ms"] > 0 and out["step"]
    assert 0 < w["projected_step_ms"] < out["summary"]["projected_step_ms"]


def test_validate_refuses_a_target_equal_to_the_run(tiny_run, capsys) -> None:
    assert run_cli(["project", str(tiny_run.path), "--validate"]) == 1
    err = capsys.readouterr().err
    assert "target equals the Run" in err and len(err.strip().splitlines()) == 1


def test_machine_cli_json_and_file(tmp_path, capsys) -> None:
    out_file = tmp_path / "here.toml"
    assert run_cli(["machine", "--json", "-o", str(out_file)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["name"] == "cached box" and data["peak_gflops"]["fp32"] == 180.0
    assert load_machine_file(out_file).gemm_peak_gflops(threads=1) == 90.0
    assert data["page_fault_ms_per_mib"] == 0.2 and load_machine_file(out_file).page_fault_ms_per_mib == 0.2
    assert run_cli(["machine"]) == 0
    assert "first touch of freshly mapped memory (page faults, zeroing): 0.2 ms/MiB" in capsys.readouterr().out


def test_cli_errors_are_one_line(tmp_path, capsys) -> None:
    assert run_cli(["project", str(tmp_path / "nope")]) == 1
    assert "no such Run" in capsys.readouterr().err
    empty = create_run(tmp_path / "runs", label="empty")
    assert run_cli(["project", str(empty.path)]) == 1
    assert "nothing" not in (err := capsys.readouterr().err) and "no oneDNN primitive" in err
    bad = tmp_path / "bad.toml"
    bad.write_text("cores = [")
    assert run_cli(["project", str(empty.path), "--machine", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "cannot read machine file" in err and len(err.strip().splitlines()) == 1


def test_engine_comparison_on_and_off(tmp_path) -> None:
    from profilednn.projection import compare_engines
    from profilednn.run import load_run

    cmp = compare_engines("small_cnn", runs_dir=tmp_path / "runs", steps=1, warmup=1, threads=1,
                          batch_size=2, image_size=16)
    assert set(cmp.runs) == {"onednn", "native"}
    on, off = load_run(cmp.runs["onednn"]), load_run(cmp.runs["native"])
    assert on.manifest["engine"] == "onednn" and off.manifest["engine"] == "native"
    assert on.table("primitives").height > 0  # convolutions went through oneDNN
    assert off.table("primitives").height == 0  # and not with it switched off
    step = cmp.by_phase.filter(pl.col("phase") == "step").row(0, named=True)
    assert step["speedup"] == pytest.approx(step["native_ms"] / step["onednn_ms"])
    assert cmp.by_layer.filter(pl.col("module_type") == "Conv2d").height > 0

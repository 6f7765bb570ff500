"""``profilednn memory`` and ``profilednn pipeline``: Runs, report sections, errors."""

from __future__ import annotations

import pytest
import torch

from profilednn.cli import run_cli
from profilednn.memory.report import report_sections
from profilednn.run import create_run, iter_runs, load_run


def _only_run(runs_dir, label):
    runs = [r for r in iter_runs(runs_dir) if label in r.id]
    assert len(runs) == 1
    return runs[0]


def test_memory_verb_writes_a_run_with_a_report_section(tmp_path, capsys):
    code = run_cli(["memory", "--model", "small_cnn", "--batch-size", "2", "--image-size", "16",
                    "--budget", "12MiB", "--tradeoff", "--offload-min-bytes", "0", "-o", str(tmp_path)])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 0, out
    assert "predicted vs measured" in out and "saved activations" in out and "confirmed batch" in out
    run = _only_run(tmp_path, "memory-small_cnn")
    assert run.status == "complete"
    assert {"memory_layers", "memory_summary", "memory_budget", "memory_tradeoff"} <= set(run.tables())
    assert run.manifest["memory"]["saved_measured_bytes"] == run.manifest["memory"]["saved_predicted_bytes"]
    sections = report_sections(run)
    assert [s.title for s in sections] == ["Memory"]
    assert "Predicted vs measured" in sections[0].html and "Memory vs step time" in sections[0].html
    assert run_cli(["report", str(run.path)]) == 0
    assert "Memory" in (run.path / "report.html").read_text()


def test_memory_verb_adds_tables_to_a_profiled_run(tmp_path):
    from profilednn.capture import profile_builtin

    run = profile_builtin("small_cnn", tmp_path, steps=1, warmup=0, light=True, batch_size=2, image_size=16)
    assert run_cli(["memory", str(run.path)]) == 0
    run = load_run(run.path)
    assert {"layers", "memory_layers", "memory_summary"} <= set(run.tables())
    assert run.manifest["memory"]["batch_size"] == 2
    assert len(list(iter_runs(tmp_path))) == 1  # no new Run


def test_memory_verb_needs_a_model_or_a_run(tmp_path, capsys):
    assert run_cli(["memory", "-o", str(tmp_path)]) == 2
    assert run_cli(["memory", "--model", "small_cnn", "--budget", "lots", "-o", str(tmp_path)]) == 1
    assert "memory size" in capsys.readouterr().err


def test_report_sections_are_empty_without_memory_tables(tmp_path):
    assert report_sections(create_run(tmp_path, label="plain")) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_pipeline_on_a_missing_device_is_one_line_and_exit_1(tmp_path, capsys):
    assert run_cli(["pipeline", "--model", "digits_mlp", "--stages", "cuda:0,cpu", "-o", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert "cuda:0" in err and len(err.splitlines()) == 1


def test_pipeline_verb_trains_digits_and_writes_a_run(tmp_path, capsys):
    code = run_cli(["pipeline", "--model", "digits_mlp", "--stages", "cpu,cpu", "--schedule", "async",
                    "--microbatches", "2", "--epochs", "1", "--balance", "3,2", "-o", str(tmp_path)])
    out = " ".join(capsys.readouterr().out.split())  # rich wraps lines at the console width
    assert code == 0, out
    assert "test accuracy" in out and "plain training" in out
    run = _only_run(tmp_path, "pipeline-digits_mlp")
    assert {"pipeline_stages", "pipeline_steps"} <= set(run.tables())
    assert run.manifest["pipeline"]["balance"] == [3, 2]
    assert [s.title for s in report_sections(run)] == ["Pipeline"]


def test_pipeline_verb_rejects_a_bad_schedule_and_balance(tmp_path):
    assert run_cli(["pipeline", "--model", "digits_mlp", "--schedule", "sometimes", "-o", str(tmp_path)]) == 1
    assert run_cli(["pipeline", "--model", "digits_mlp", "--balance", "1,2,3", "-o", str(tmp_path)]) == 1
    assert run_cli(["pipeline", "--model", "bert_base", "--steps", "1", "-o", str(tmp_path)]) == 1

"""A job Run's report (optimize, memory, a distributed rank, a study) leads with the job's own
section and shows no profile section it has no data for; a profile Run's report keeps its
sections and their order (terminal and HTML)."""

from __future__ import annotations

import re

import polars as pl
from rich.console import Console

from profilednn import report_run
from profilednn.analysis.api import Analysis
from profilednn.optimization.abtest import Timing
from profilednn.optimization.api import OptimizeReport, RecipeResult
from profilednn.optimization.headroom import Headroom
from profilednn.report.job_run import is_job_run, phases_timed
from profilednn.report.terminal import print_run_summary
from profilednn.run import create_run
from profilednn.tables import (
    CONVERGENCE,
    DIST_STEPS,
    MEMORY_LAYERS,
    MEMORY_SUMMARY,
    OPTIMIZE_HEADROOM,
    OPTIMIZE_RECIPES,
    OPTIMIZE_SAMPLES,
    STEPS,
    steps_frame,
)
from runfactory import make_run

PROFILE_ORDER = ["Summary", "Advice", "Step", "oneDNN primitives", "Framework ops", "Layers", "Fragmentation",
                 "Fingerprint"]
ZEROS = ("0.00 ms/step", "unattributed", "not attributed", "No advice", "no rule fired", "<h2>Advice")


def _titles(html: str) -> list[str]:
    return re.findall(r"<h2>([^<]+)</h2>", html)


def _terminal(run, width: int = 80) -> str:
    console = Console(width=width, record=True, markup=False)
    a = Analysis(run.path)
    print_run_summary(a, a.advice(), console)
    return console.export_text()


def optimize_run(tmp_path):
    """An optimize Run as ``optimize_workload`` writes it (recipes, samples, whole steps, headroom)."""
    recipes = [RecipeResult("channels_last", "layout", True, "", accepted=True, decision="accepted: 1.2x",
                            before_ms=12.0, after_ms=10.0, speedup=1.2, numerics="pass", loss_max_rel_diff=0.0,
                            grad_rel_diff=0.0, samples_before=[12.0, 12.1], samples_after=[10.0, 10.1])]
    families = pl.DataFrame({"family": ["gemm", "batch_norm"], "ms_per_step": [6.0, 4.0],
                             "share_pct": [60.0, 40.0], "top_ops": ["mkldnn_convolution 6.0", "native_batch_norm 4.0"]})
    report = OptimizeReport(workload="small_cnn", recipes=recipes, accepted=["channels_last"], environment={},
                            baseline=Timing((12.0, 12.1)), final=Timing((10.0, 10.1)), threads=2,
                            headroom=Headroom(families, 3, 10.0, gemm_efficiency=0.25))
    with create_run(tmp_path, label="optimize-small_cnn", workload={"name": "small_cnn"}, kind="optimize") as run:
        run.write_table(OPTIMIZE_RECIPES, report.table())
        run.write_table(OPTIMIZE_SAMPLES, report.samples())
        run.write_table(OPTIMIZE_HEADROOM, report.headroom.table())
        run.write_table(STEPS, steps_frame([{"step": i, "time_ms": t} for i, t in enumerate((10.0, 10.1))]))
        run.set_status("complete", optimize=report.to_dict(), steps=2)
    return run


def test_an_optimize_runs_report_begins_with_the_optimize_section_and_has_no_zero_sections(tmp_path):
    run = optimize_run(tmp_path)
    a = Analysis(run.path)
    assert is_job_run(a) and not phases_timed(a.steps)
    html = report_run(run).read_text(encoding="utf-8")
    assert _titles(html) == ["Optimize", "Summary", "Fingerprint"]
    assert html.index('href="#optimize"') < html.index('href="#summary"')  # the page's contents, same order
    body = html[html.index("<h2>Summary</h2>"):]
    assert not any(z in body for z in ZEROS), [z for z in ZEROS if z in body]
    assert "no profile (no oneDNN primitives or framework ops; its steps are timed whole" in body
    assert "Where the optimized step goes" in html

    out = _terminal(run)
    first = next(line for line in out.splitlines() if line.strip())
    assert first.startswith("optimize small_cnn")  # the recipe table's title comes first
    assert "where the optimized step goes" in out and "stock 12.1 ms -> optimized 10.1 ms" in out
    assert not any(z in out for z in ZEROS), [z for z in ZEROS if z in out]
    assert "Phases" not in out and "This Run holds optimize results and no profile" in out.replace("\n", " ")
    assert max(len(line.rstrip()) for line in out.splitlines() if line[:1] in set("┏┃┡│└╭╰")) <= 80


def test_a_profile_runs_report_keeps_its_sections_in_order(tmp_path):
    run = make_run(tmp_path)
    # a job that adds tables to a profile Run (memory does) leaves it a profile Run
    run.write_table(MEMORY_SUMMARY, MEMORY_SUMMARY.frame([{"quantity": "weights", "predicted_bytes": 1,
                                                           "measured_bytes": 1}]))
    a = Analysis(run.path)
    assert not is_job_run(a)
    titles = _titles(report_run(run).read_text(encoding="utf-8"))
    assert titles == [*PROFILE_ORDER, "Memory"]
    out = _terminal(run)
    assert out.lstrip().startswith("╭") and "oneDNN primitives" in out and "Phases" in out
    assert "No advice: no rule fired." in out and "no profile" not in out


def test_a_memory_runs_report_begins_with_its_memory_tables(tmp_path):
    with create_run(tmp_path, label="memory-small_cnn", workload={"name": "small_cnn"}) as run:
        run.write_table(MEMORY_LAYERS, MEMORY_LAYERS.frame([
            {"module": "features.0", "module_type": "Conv2d", "params_bytes": 2**20, "grad_bytes": 2**20,
             "optimizer_state_bytes": 2**20, "saved_predicted_bytes": 2**22, "saved_measured_bytes": 2**22,
             "workspace_bytes": 0, "io_bytes": 2**20}]))
        run.write_table(MEMORY_SUMMARY, MEMORY_SUMMARY.frame([
            {"quantity": "saved activations", "predicted_bytes": 2**22, "measured_bytes": 2**22}]))
        run.update(memory={"workload": "small_cnn", "batch_size": 8, "device": "cpu"})
    html = report_run(run).read_text(encoding="utf-8")
    assert _titles(html) == ["Memory", "Summary", "Fingerprint"]
    out = _terminal(run)
    assert next(line for line in out.splitlines() if line.strip()).startswith("small_cnn batch 8 on cpu")
    assert not any(z in out for z in ZEROS)


def test_a_rank_run_without_capture_keeps_its_timed_phases_and_a_study_run_its_table(tmp_path):
    rows = [{"rank": 0, "step": s, "time_ms": 100.0, "loss": 1.0, "data_ms": 1.0, "forward_ms": 30.0,
             "backward_ms": 60.0, "optimizer_ms": 9.0, "allreduce_ms": 5.0, "exposed_comm_ms": 1.0,
             "compute_ms": 99.0, "buckets": 1, "allreduce_bytes": 4000} for s in range(3)]
    with create_run(tmp_path, label="rank0", workload={"name": "small_cnn"}) as rank:
        rank.write_table(DIST_STEPS, DIST_STEPS.frame(rows))
        rank.write_table(STEPS, STEPS.frame([{**r, "loss_ms": 0.0, "other_ms": 0.0} for r in rows]))
    html = report_run(rank).read_text(encoding="utf-8")
    assert _titles(html) == ["Distributed training", "Summary", "Step", "Fingerprint"]
    step = html[html.index("<h2>Step</h2>"):html.index("<h2>Fingerprint</h2>")]
    assert "backward" in step and "Coverage" not in step and "<svg" not in step
    out = _terminal(rank)
    assert "rank0" in next(line for line in out.splitlines() if line.strip())  # its per-rank table
    assert "Phases" in out and not any(z in out for z in ZEROS)

    with create_run(tmp_path, label="convergence", workload={"name": "digits"},
                    convergence={"target": 0.9, "lr_scaling": "sqrt"}) as study:
        study.write_table(CONVERGENCE, CONVERGENCE.frame([
            {"global_batch": 32, "lr": 0.05, "steps_per_epoch": 40, "epochs_to_target": 3, "steps_to_target": 120,
             "seeds_reached": 3, "best_accuracy": 0.95, "convergence_ratio": 1.0}]))
        study.set_status("complete", advice=["global batch 32 reaches 90% fastest"])
    assert _titles(report_run(study).read_text(encoding="utf-8"))[0] == "Convergence vs global batch"
    out = _terminal(study)
    assert next(line for line in out.splitlines() if line.strip()).startswith("epochs to 90% test accuracy")
    assert "advice: global batch 32" in out and not any(z in out for z in ZEROS)

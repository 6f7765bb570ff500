"""Job tables stay readable in an 80-column terminal (essential columns, wrapped cells, no
cell cut to "…"); ``--wide`` prints every column at its natural width."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from profilednn.cli import run_cli
from profilednn.cli.app import console as cli_console
from profilednn.formatting import FULL_TABLE_WIDTH, finite, fixed, full_tables, ms, num, pct, spec
from profilednn.optimization.abtest import Timing
from profilednn.optimization.api import OptimizeReport, RecipeResult
from profilednn.optimization.terminal import print_recipes
from cached_machine import cached_box, use_cached
from runfactory import make_run

MACHINE = cached_box()


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
    use_cached(monkeypatch, tmp_path / "cache", MACHINE)
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


# -- every job's printer at 80 columns --------------------------------------------------
# Each table fits, cuts no cell, keeps every column at least 3 characters wide, and its
# headers whole (a header may wrap between words, never inside one).


def _columns(out: str, first: str) -> list[tuple[str, int]]:
    """(header, content width) per column of the boxed table whose first header is ``first``;
    a header wrapped onto several lines is joined with spaces."""
    lines = [line.rstrip() for line in out.splitlines()]
    for i, line in enumerate(lines):
        if not line.startswith("┏"):
            continue
        widths = [len(segment) - 2 for segment in line.strip("┏┓").split("┳")]
        parts: list[list[str]] = [[] for _ in widths]
        j = i + 1
        while j < len(lines) and lines[j].startswith("┃"):
            for k, cell in enumerate(lines[j].strip("┃").split("┃")):
                if cell.strip():
                    parts[k].append(cell.strip())
            j += 1
        names = [" ".join(p) for p in parts]
        if names and names[0] == first:
            return list(zip(names, widths))
    raise AssertionError(f"no table whose first column is {first!r} in:\n{out}")


def _column_text(out: str, index: int) -> str:
    """Column ``index`` of every body line, concatenated: a folded cell reads whole."""
    return "".join(line.strip("│").split("│")[index].strip() for line in out.splitlines() if line.startswith("│"))


def _readable(out: str, first: str, headers: list[str], width: int = 80) -> None:
    _fits(out, width)
    columns = _columns(out, first)
    assert [name for name, _ in columns] == headers
    assert min(w for _, w in columns) >= 3, columns


def _render(print_fn, *args, width: int = 80, **kwargs) -> str:
    console = Console(width=width, record=True, markup=False)
    print_fn(*args, console, **kwargs)
    return console.export_text()


def test_capture_layer_table_fits_80_columns(tmp_path):
    from profilednn.capture.terminal import print_layer_table

    run = make_run(tmp_path)
    printed = None

    def render(r, console):
        nonlocal printed
        printed = print_layer_table(r, console)

    out = _render(render, run)
    _readable(out, "layer", ["layer", "type", "forward ms", "backward ms", "total ms", "share"])
    assert printed is True
    layers = run.table("layers")["module"].unique().to_list()
    assert any(name in out for name in layers), layers  # rows, not only a header


def test_layer_table_prints_names_under_the_scope_every_layer_shares(tmp_path):
    """A task module or DDP wrapping the model (timm's ``trainable_module.``, ``module.``)
    puts the same prefix on every layer: the title names it once, the rows print the rest."""
    import polars as pl

    from profilednn.capture.terminal import common_scope, print_layer_table

    assert common_scope(["module.layer1.0.conv1", "module.fc"]) == "module."
    assert common_scope(["task.body.layer1.conv", "task.body.fc"]) == "task.body."
    assert common_scope(["0", "1.weight"]) == "" and common_scope(["a.b", "c.d"]) == ""
    assert common_scope(["only.one"]) == ""
    assert common_scope(["a.x", "a"]) == ""  # never a whole name

    run = make_run(tmp_path)
    layers = run.table("layers")
    pseudo = pl.col("module").is_in(["data", "loss", "optimizer", "other"])
    run.write_table("layers", layers.with_columns(
        module=pl.when(pseudo).then(pl.col("module")).otherwise("trainable_module." + pl.col("module"))))
    out = _render(lambda r, console: print_layer_table(r, console), run)
    _readable(out, "layer", ["layer", "type", "forward ms", "backward ms", "total ms", "share"])
    assert "per layer of trainable_module," in out
    assert "trainable_module." not in _column_text(out, 0)
    shown = set(layers.filter(~pseudo)["module"].unique().to_list())
    assert any(name in _column_text(out, 0) for name in shown)


def test_breakdown_table_fits_80_columns():
    from profilednn.verbose.api import breakdown, read_log
    from profilednn.verbose.terminal import print_breakdown

    log = Path(__file__).parent / "fixtures" / "verbose" / "onednn_v3.6.log"
    keys = ["driver", "impl", "problem"]
    out = _render(print_breakdown, breakdown(read_log(log), keys, "exec"), keys, "exec", log.name)
    _readable(out, "driver", [*keys, "calls", "total ms", "share", "avg ms"])
    assert "brg_matmul:avx512_core_amx" in _column_text(out, 1)  # folded, whole


def test_report_summaries_fit_80_columns(tmp_path):
    from profilednn.analysis.api import Analysis, advise, compare
    from profilednn.report.terminal import print_compare_summary, print_run_summary

    a = Analysis(make_run(tmp_path, loss="focal", optimizer="per_param"))
    advice = advise(a)
    out = _render(print_run_summary, a, advice)
    _fits(out, 80)
    assert max(len(line.rstrip()) for line in out.splitlines()) <= 80
    advice_header = next(line for line in out.splitlines() if line.lstrip().startswith("#"))
    assert [c.strip() for c in advice_header.split("┃")] == ["#", "rule / severity", "gain", "evidence and action"]
    assert advice and all(a.rule in out for a in advice)
    cmp = compare(make_run(tmp_path), make_run(tmp_path, layout="nchw"))
    out = _render(print_compare_summary, cmp, [])
    assert out and max(len(line.rstrip()) for line in out.splitlines()) <= 80 and "…" not in out


def test_runs_table_fits_80_columns_and_wide_adds_workload_and_created(tmp_path):
    from profilednn.report.api import list_runs
    from profilednn.report.terminal import print_runs

    make_run(tmp_path, workload="retinanet_resnext50_fpn")
    make_run(tmp_path, workload="alpha", status="interrupted")
    rows = list_runs(tmp_path)
    out = _render(print_runs, rows, tmp_path)
    _readable(out, "directory", ["directory", "status", "steps", "median step ms"])
    assert all(Path(p).name in out for p in rows["path"])  # each directory on one line, as typed
    wide = _render(print_runs, rows, tmp_path, wide=True)
    assert [h for h, _ in _columns(wide, "directory")] == ["directory", "status", "workload", "steps",
                                                           "median step ms", "created"]


def test_workloads_table_fits_80_columns():
    from profilednn.workloads.api import list_workloads
    from profilednn.workloads.terminal import print_workloads

    workloads = list_workloads()
    out = _render(print_workloads, workloads, ["threads", "dtype"])
    _readable(out, "Workload", ["Workload", "Description", "Knobs (defaults)"])
    names = [w.name for w in workloads]
    assert names and all(name in _column_text(out, 0) for name in names)  # each name whole, unfolded


def test_projection_tables_fit_80_columns():
    import polars as pl

    from profilednn.projection.engines import EngineComparison
    from profilednn.projection.terminal import print_engines, print_machine, print_validation
    from profilednn.projection.validate import Validation

    _readable(_render(print_machine, MACHINE), "dtype", ["dtype", "threads", "median", "min", "max (peak)", "repeats"])
    phases = pl.DataFrame({"phase": ["forward", "backward"], "measured_a_ms": [10.0, 20.0],
                           "predicted_b_ms": [6.0, 11.0], "measured_b_ms": [6.5, 12.0], "error": [-0.07, -0.08]})
    parts = phases.rename({"phase": "part"}).with_columns(pl.Series("part", ["oneDNN primitives", "native kernels"]))
    validation = Validation(phases, parts, {"a": "2 threads", "b": "1 thread", "own_projected_step_ms": 30.0,
                                            "measured_a_step_ms": 31.0, "own_error": -0.03,
                                            "predicted_b_step_ms": 17.0, "measured_b_step_ms": 18.5,
                                            "error": -0.08, "run_b": "runs/b"})
    _readable(_render(print_validation, validation), "part",
              ["part", "measured_a_ms", "predicted_b_ms", "measured_b_ms", "error"])
    layers = pl.DataFrame({"module": ["backbone.body.layer4.2.conv3", "head.classification_head.cls_logits"],
                           "module_type": ["Conv2d", "Conv2d"], "phase": ["backward", "forward"],
                           "onednn_ms": [1.0, 2.0], "native_ms": [5.0, 6.0], "speedup": [5.0, 3.0]})
    engines = EngineComparison(
        pl.DataFrame({"phase": ["forward"], "onednn_ms": [10.0], "native_ms": [30.0], "speedup": [3.0]}), layers,
        {"onednn_step_ms": 30.0, "native_step_ms": 90.0, "speedup": 3.0}, {})
    out = _render(print_engines, engines, 10)
    _readable(out, "module", ["module", "type", "phase", "onednn_ms", "native_ms", "speedup"])
    assert "head.classification_head.cls_logits" in _column_text(out.split("Per layer")[1], 0)  # whole


def _memory_run(tmp_path):
    from profilednn.run import create_run
    from profilednn.tables import MEMORY_LAYERS, MEMORY_SUMMARY, MEMORY_TRADEOFF

    with create_run(tmp_path, label="memory") as run:
        run.write_table(MEMORY_LAYERS, MEMORY_LAYERS.frame([
            {"module": f"backbone.body.layer{i}.0.conv{j}", "module_type": "Conv2d", "params_bytes": 2**20 * i,
             "grad_bytes": 2**20 * i, "optimizer_state_bytes": 2**21 * i, "saved_predicted_bytes": 3 * 2**22 * j,
             "saved_measured_bytes": 3 * 2**22 * j, "workspace_bytes": 2**18, "io_bytes": 2**20}
            for i in (1, 2) for j in (1, 2)]))
        run.write_table(MEMORY_SUMMARY, MEMORY_SUMMARY.frame([
            {"quantity": "workspace (largest layer)", "predicted_bytes": 10**6, "measured_bytes": 2 * 10**6}]))
        run.write_table(MEMORY_TRADEOFF, MEMORY_TRADEOFF.frame([
            {"config": config, "checkpoint_policy": policy, "device": "cpu", "batch_size": 8,
             "saved_device_bytes": 10**8, "offloaded_bytes": 0, "peak_bytes": 3 * 10**8, "peak_vs_none": 1.0,
             "step_ms": 123.4, "slowdown_vs_none": 1.0}
            for config, policy in (("none", "none"), ("checkpoint", "every 2nd block"))]))
        run.update(memory={"workload": "resnet50", "batch_size": 8, "device": "cpu"})
    return run


def test_memory_and_pipeline_tables_fit_80_columns(tmp_path):
    from profilednn.memory.pipeline.runner import PipelineResult
    from profilednn.memory.terminal import print_memory, print_pipeline
    from profilednn.tables import PIPELINE_STAGES, PIPELINE_STEPS

    out = _render(print_memory, _memory_run(tmp_path))
    _readable(out, "layer", ["layer", "weights", "grads", "optim state", "saved pred.", "saved meas."])
    _readable(out, "quantity", ["quantity", "predicted", "measured", "error"])
    _readable(out, "config", ["config", "checkpoint", "peak", "peak/none", "step ms", "slowdown"])
    wide = _render(print_memory, _memory_run(tmp_path), wide=True)
    assert [h for h, _ in _columns(wide, "config")] == ["config", "checkpoint", "saved on device", "offloaded",
                                                        "peak", "peak/none", "step ms", "slowdown"]
    stages = PIPELINE_STAGES.frame([
        {"stage": i, "device": "cpu:0", "layers": 5, "first_layer": "backbone.layer1.0.conv1",
         "last_layer": "backbone.layer4.2.relu", "params_bytes": 10**7, "activation_bytes_per_microbatch": 10**6,
         "predicted_ms": 12.5, "busy_ms": 30.1, "max_in_flight": 2, "max_weight_versions": 2} for i in range(2)])
    result = PipelineResult(stages, PIPELINE_STEPS.frame([]), {"balance": [5, 5], "balance_source": "profiled",
                                                               "steps": 4, "median_step_ms": 60.2, "final_loss": 1.2})
    out = _render(print_pipeline, result, "pipeline 1F1B")
    _readable(out, "stage", ["stage", "device", "layers", "weights", "act./micro-batch", "busy ms/step"])
    wide = _render(print_pipeline, result, "pipeline 1F1B", wide=True)
    assert [h for h, _ in _columns(wide, "stage")][-3:] == ["busy ms/step", "in flight", "weight versions"]


def test_distributed_tables_fit_80_columns(tmp_path):
    import polars as pl

    from profilednn.distributed.comm import AlphaBeta
    from profilednn.distributed.convergence import ConvergenceResult
    from profilednn.distributed.launch import LaunchSettings, prepare_launch
    from profilednn.distributed.merge import STEP_SCHEMA, merge_rank_steps
    from profilednn.distributed.projection import NodeProjection
    from profilednn.distributed.scale import ScaleResult
    from profilednn.distributed.terminal import (
        print_convergence,
        print_node_projection,
        print_plan,
        print_ranks,
        print_scale,
    )
    from profilednn.tables import CONVERGENCE, SCALE
    from profilednn.topology import Core, CpuTopology

    steps = [{"rank": r, "step": s, "time_ms": 100.0 + r, "loss": 1.0, "data_ms": 0.1, "forward_ms": 30.0,
              "backward_ms": 60.0, "optimizer_ms": 5.0, "allreduce_ms": 12.0, "exposed_comm_ms": 4.0,
              "compute_ms": 90.0 + 10 * (r == 1), "buckets": 1, "allreduce_bytes": 4000}
             for r in range(4) for s in range(3)]
    per_rank = merge_rank_steps(pl.DataFrame(steps, schema=STEP_SCHEMA), warmup=1).per_rank
    _readable(_render(print_ranks, per_rank, "job: 4 ranks"), "rank",
              ["rank", "step ms", "compute", "allreduce", "exposed", "comm %", "strag."])

    run = _memory_run(tmp_path)  # any Run: the printers name its path
    scale = SCALE.frame([{"mode": "strong", "ranks": r, "threads": t, "cores_used": r * t, "local_batch": 16 // r,
                          "global_batch": 16, "step_ms": 100.0 / (r * t), "items_per_s": 160.0 * r * t,
                          "normalized": 1.0 * r * t, "efficiency": 0.95} for r in (1, 2, 4, 8) for t in (1, 2, 4, 8)])
    out = _render(print_scale, ScaleResult(run, scale))
    _readable(out, "threads \\ ranks", ["threads \\ ranks", "1", "2", "4", "8"])
    _readable(out, "ranks", ["ranks", "threads", "global", "step ms", "items/s", "norm.", "eff."])

    convergence = CONVERGENCE.frame([{"global_batch": g, "lr": 0.05, "steps_per_epoch": 1437 // g,
                                      "epochs_to_target": None if g > 256 else 3, "seeds_reached": 1,
                                      "best_accuracy": 0.9} for g in (16, 1024)])
    out = _render(print_convergence, ConvergenceResult(run, convergence), 0.9, "linear")
    _readable(out, "global batch", ["global batch", "lr", "steps/epoch", "epochs", "steps", "ratio", "best acc"])

    nodes = NodeProjection(100.0, 100e6, 2, 32, AlphaBeta(50e-6, 1 / 1.25e9, 2, "given")).table(64)
    _readable(_render(print_node_projection, nodes, [], run.path), "nodes",
              ["nodes", "ranks", "step ms", "items/s", "speedup", "efficiency"])

    topology = CpuTopology(model_name="synthetic", cores=tuple(
        Core(socket=s, core=c, node=s, cpus=(4 * s + c,)) for s in range(2) for c in range(4)))
    settings = LaunchSettings(nproc_per_node=4, threads_per_rank=2, job_id="plan", runs_dir=tmp_path)
    prepared = prepare_launch(["python", "train.py"], settings, check=False, topology=topology)
    try:
        out = _render(print_plan, prepared)
    finally:
        prepared.discard()
    assert [h for h, _ in _columns(out, "local rank")] == ["local rank", "socket", "NUMA node", "cpus (pinned)",
                                                           "threads", "memory"]
    _fits(out.split("backend:")[0], 80)  # the table; the launcher command below is one long copyable line


def test_help_prose_wraps_to_the_terminal_not_at_the_docstrings_line_ends(monkeypatch, capsys):
    from profilednn.cli.app import reflowed

    doc = """First line.

    A paragraph written over
    two source lines.

    - a list item
    - another
    """
    assert reflowed(doc) == "First line.\n\nA paragraph written over two source lines.\n\n- a list item\n- another"
    monkeypatch.setenv("COLUMNS", "200")  # wide: a sentence is cut only where the docstring was
    assert run_cli(["optimize", "--help"]) == 0
    out = capsys.readouterr().out
    assert "A/B-timed against the current best in paired rounds, order alternating, until the speedup" in out

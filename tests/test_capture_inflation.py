"""Which layers' times a full capture inflated: each layer against its light reference (the
warm-up steps after the first, observed without torch.profiler). The verdict is checked on
injected per-layer samples; real captures are checked for what they store, never for times."""

from __future__ import annotations

from pathlib import Path

import polars as pl
from rich.console import Console

from profilednn import load_run, profile_builtin, profile_script
from profilednn.capture.terminal import INFLATED_MARK, print_layer_table
from profilednn.step_summary import (
    MIN_REFERENCE_STEPS, fwd_bwd_by_layer, inflation_note, layer_inflation, ranked_by_light, reference_steps,
)
from profilednn.tables import LAYER_REFERENCE, LAYERS
from profilednn.verbose.markers import STEP_END, WIN_OPEN, read_markers


def _layers(samples: dict[str, list[float]], faults: dict[str, int] | None = None) -> pl.DataFrame:
    """A layers table: per leaf layer its forward ms in each step (backward ms half of it) and,
    where given, its minor faults a step (all in the forward)."""
    rows = [{"module": m, "module_type": "Linear" if m == "fc" else "Dropout", "phase": phase, "calls": 1,
             "time_ms": ms * share, "params": 0, "trainable_params": 0, "leaf": True, "step": step,
             "faults": None if faults is None else (faults.get(m, 0) if phase == "forward" else 0)}
            for m, per_step in samples.items() for step, ms in enumerate(per_step)
            for phase, share in (("forward", 2 / 3), ("backward", 1 / 3))]
    return LAYERS.frame(rows)


FULL = {"drop": [30.0, 31.0, 29.0], "fc": [40.5, 41.5, 40.0], "tiny": [0.9, 0.9, 0.9], "new": [5.0, 5.0, 5.0]}
LIGHT = {"drop": [10.0, 10.5, 9.5], "fc": [39.0, 42.0, 40.0], "tiny": [0.3, 0.3, 0.3]}
STEP_MS = 100.0


def _verdict(light: dict[str, list[float]]) -> dict[str, dict[str, object]]:
    frame = layer_inflation(_layers(FULL), _layers(light), STEP_MS)
    return {r["module"]: r for r in frame.iter_rows(named=True)}


def test_a_layer_inflated_3x_is_flagged_one_within_its_spread_is_not() -> None:
    got = _verdict(LIGHT)
    assert got["drop"]["inflated"] is True  # 30 vs 10 ms, light spread 1 ms
    assert got["drop"]["full_ms"] == 30.0 and got["drop"]["light_ms"] == 10.0
    assert got["drop"]["light_spread_ms"] == 1.0 and got["drop"]["ratio"] == 3.0
    assert got["fc"]["inflated"] is False  # +0.5 ms, inside the light steps' 3 ms spread
    assert got["tiny"]["inflated"] is False  # x3 but 0.6 ms: under 2% of the 100 ms step
    assert got["new"]["light_ms"] is None and got["new"]["inflated"] is False  # never seen light
    note = inflation_note(layer_inflation(_layers(FULL), _layers(LIGHT), STEP_MS), 3)
    assert note is not None and note.startswith("the full capture inflated 1 layer beyond the light reference")
    assert "drop 30.00 vs 10.00 (x3.0)" in note and "fc" not in note


def test_an_inflation_made_of_page_faults_says_so_and_the_light_time_ranks_the_layers() -> None:
    full = {**FULL, "drop": [60.0, 61.0, 59.0]}  # heavier than fc under the full capture, lighter alone
    frame = layer_inflation(_layers(full, {"drop": 80_000, "fc": 2_000}), _layers(LIGHT, {"drop": 2_000, "fc": 2_000}),
                            STEP_MS)
    drop = frame.filter(pl.col("module") == "drop").row(0, named=True)
    assert (drop["full_faults"], drop["light_faults"], drop["inflated"]) == (80_000.0, 2_000.0, True)
    note = inflation_note(frame, 3)
    assert note is not None and "drop 60.00 vs 10.00 (x6.0; 80,000 vs 2,000 page faults a step)" in note
    assert "1 of them page-faulted far more under torch.profiler" in note
    assert note.endswith("the layer table ranks layers by their light ms")
    per_layer = fwd_bwd_by_layer(_layers(full), 3)
    assert per_layer["module"].to_list()[:2] == ["drop", "fc"]
    ranked = ranked_by_light(per_layer, frame)
    assert ranked["module"].to_list() == ["fc", "drop", "tiny", "new"]  # new: never seen light, last
    # the same excess without a fault surplus: inflated, but not said to be faults
    same = layer_inflation(_layers(full, {"drop": 2_000}), _layers(LIGHT, {"drop": 2_000}), STEP_MS)
    note = inflation_note(same, 3)
    assert note is not None and "(x6.0; 2,000 vs 2,000 page faults a step)" in note and "page-faulted" not in note


def test_too_few_light_steps_flag_nothing_and_say_so() -> None:
    two = {m: v[:2] for m, v in LIGHT.items()}
    assert not any(r["inflated"] for r in _verdict(two).values())
    assert reference_steps(_layers(two)) == 2 < MIN_REFERENCE_STEPS
    note = inflation_note(layer_inflation(_layers(FULL), _layers(two), STEP_MS), 2)
    assert note is not None and "too few to estimate" in note and "--warmup 4" in note
    # enough steps and nothing inflated: nothing to say
    assert inflation_note(layer_inflation(_layers(LIGHT), _layers(LIGHT), STEP_MS), 3) is None


def test_a_full_capture_keeps_its_light_reference_and_the_table_shows_it(tmp_path: Path) -> None:
    run = profile_builtin("small_cnn", tmp_path, steps=2, warmup=4, batch_size=2, image_size=16)
    run = load_run(run.path)
    reference = run.table(LAYER_REFERENCE)
    assert sorted(reference["step"].unique()) == [0, 1, 2]  # warm-up steps 1-3; step 0 is cold
    assert set(run.layers["module"]) == set(reference["module"])
    assert run.manifest["capture"]["light_reference"]["steps"] == 3
    inflated = run.manifest["capture"]["light_reference"]["inflated"]
    assert set(inflated) <= set(run.layers["module"])
    # only the window stays in the log: the light observation of warm-up was read and dropped
    markers = read_markers(run.path / "verbose.log")
    assert [m.args[0] for m in markers if m.event == WIN_OPEN] == ["4"]
    assert [int(m.args[0]) for m in markers if m.event == STEP_END] == [4, 5]
    console = Console(width=80, record=True, markup=False)
    assert print_layer_table(run, console)
    out = console.export_text()
    assert "light" in out.splitlines()[2] and "light reference steps" in out
    # the rows are ranked by their light ms, heaviest first
    rows = [[c.strip() for c in line.split("\u2502")[1:-1]] for line in out.splitlines() if "\u2502" in line]
    lights = [float(cells[-1].rstrip(INFLATED_MARK)) for cells in rows
              if len(cells) == 7 and cells[-1] and cells[1] not in {"type", "(phase)"}]
    assert len(lights) >= 3 and lights == sorted(lights, reverse=True)
    assert run.layers["faults"].null_count() == 0  # every marker carried the process's faults
    assert (INFLATED_MARK in out.replace(f"{INFLATED_MARK}: inflated", "")) == bool(inflated)
    assert max(len(line) for line in out.splitlines()) <= 80


def test_a_light_capture_and_a_single_warm_up_step_keep_no_reference(tmp_path: Path) -> None:
    light = profile_builtin("small_cnn", tmp_path / "light", steps=1, warmup=4, light=True, batch_size=2,
                            image_size=16)
    one = profile_builtin("small_cnn", tmp_path / "one", steps=1, warmup=1, batch_size=2, image_size=16)
    for run in (light, one):
        assert not run.has_table(LAYER_REFERENCE) and "light_reference" not in run.manifest["capture"]
        assert not any("light reference" in n for n in run.manifest["notes"])


SCRIPT = """
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(4, 8), torch.tensor([0, 1, 0, 1])
for it in range(20):
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    if it == 1:  # an evaluation in a light reference step: no layer's time
        with torch.no_grad():
            model(x)
"""


def test_a_script_gets_its_reference_from_warm_up_or_a_note_when_too_short(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    run, code = profile_script(["python", str(script)], tmp_path / "a", steps=2, warmup=4, stop_after=True)
    assert code == 0 and run.status == "complete"
    run = load_run(run.path)
    reference = run.table(LAYER_REFERENCE)
    assert sorted(reference["step"].unique()) == [0, 1, 2]
    fwd = reference.filter((pl.col("phase") == "forward") & (pl.col("module") == "0"))
    assert fwd["calls"].to_list() == [1, 1, 1]  # the evaluation's call is in none of them
    assert run.manifest["stopped_after_steps"] == 6 and run.steps.height == 2
    short, code = profile_script(["python", str(script)], tmp_path / "b", steps=2, warmup=2, stop_after=True)
    assert code == 0
    assert reference_steps(load_run(short.path).table(LAYER_REFERENCE)) == 1
    (note,) = [n for n in short.manifest["notes"] if "light reference" in n]
    assert note.startswith("1 light reference step (the warm-up steps after the first")

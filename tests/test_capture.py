"""Capture: built-in workloads, user scripts and the API write complete, attributed Runs."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import polars as pl
import pytest
import torch

from profilednn import RunError, load_run
from profilednn.step_summary import fwd_bwd_by_layer
from profilednn.capture import capture, profile_builtin, profile_script
from profilednn.capture.attribute import Timeline
from profilednn.capture.capture_tables import attributed_events
from profilednn.cli import run_cli
from profilednn.verbose.schema import CAPTURE_COLUMNS, PRIMITIVE_COLUMNS

from fresh_memory import touch_fresh_memory

TRAIN_SCRIPT = """
import sys
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
                      nn.Flatten(), nn.Linear(8 * 8 * 8, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = nn.CrossEntropyLoss()
x = torch.randn(2, 3, 8, 8)
y = torch.tensor([0, 1])
for step in range({steps}):
    print(f"user step {{step}}", flush=True)
    opt.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
{tail}
"""


def _script(tmp_path: Path, steps: int = 4, tail: str = "") -> Path:
    p = tmp_path / "train.py"
    p.write_text(TRAIN_SCRIPT.format(steps=steps, tail=textwrap.dedent(tail)))
    return p


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory):
    torch.manual_seed(0)
    runs = tmp_path_factory.mktemp("runs")
    return profile_builtin("small_cnn", runs, steps=2, warmup=1, batch_size=4)


def test_builtin_run_has_every_table_and_contract_columns(small_run) -> None:
    run = load_run(small_run.path)
    assert run.status == "complete"
    assert set(run.tables()) >= {"primitives", "ops", "op_events", "layers", "steps", "spans"}
    assert run.verbose_log.exists() and run.verbose_log.stat().st_size > 0
    prims = run.primitives
    assert set(PRIMITIVE_COLUMNS) <= set(prims.columns)
    assert set(CAPTURE_COLUMNS) <= set(prims.columns)
    assert set(run.ops.columns) >= {"op", "module", "phase", "input_shapes", "calls", "self_time_ms", "step"}
    assert set(run.layers.columns) >= {"module", "module_type", "phase", "calls", "time_ms"}
    assert set(run.steps.columns) >= {"step", "time_ms", "loss"}
    assert run.steps["step"].to_list() == [0, 1]
    assert run.steps["time_ms"].min() > 0
    assert run.steps["loss"].null_count() == 0
    fp = run.fingerprint
    for key in ("cpu_model", "cores", "isa_flags", "torch", "onednn", "threads", "native_bf16"):
        assert key in fp, key
    assert run.manifest["workload"]["name"] == "small_cnn"


def test_conv_primitives_land_on_conv_modules_and_right_phases(small_run) -> None:
    prims = load_run(small_run.path).primitives
    conv = prims.filter(pl.col("driver") == "conv")
    assert conv.height > 0
    conv_modules = {m for m, t in zip(small_run.layers["module"], small_run.layers["module_type"]) if t == "Conv2d"}
    assert set(conv["module"].unique().to_list()) <= conv_modules
    fwd = conv.filter(pl.col("prop_kind") == "forward_training")
    bwd = conv.filter(pl.col("prop_kind").is_in(["backward_data", "backward_weights"]))
    assert fwd.height > 0 and bwd.height > 0
    assert set(fwd["phase"].unique()) == {"forward"}
    assert set(bwd["phase"].unique()) == {"backward"}
    # The first conv has no input gradient to compute: only backward_weights there.
    assert set(conv.filter(pl.col("prop_kind") == "backward_data")["module"]) < conv_modules
    assert all("conv" in op for op in conv["op"].drop_nulls())
    assert conv["op"].null_count() == 0
    assert set(prims["step"].unique()) == {0, 1}


def test_layer_table_and_phase_times_add_up(small_run) -> None:
    assert {"loss", "optimizer", "data"} <= set(small_run.layers["module"])
    table = fwd_bwd_by_layer(small_run.layers, small_run.steps.height)
    convs = table.filter(pl.col("module_type") == "Conv2d")
    assert (convs["forward_ms"] > 0).all() and (convs["backward_ms"] > 0).all()
    steps = small_run.steps
    phase_sum = sum(steps[f"{p}_ms"] for p in ("data", "forward", "loss", "backward", "optimizer", "other"))
    # Phases tile the step: their sum equals the step's wall time.
    assert (abs(phase_sum - steps["time_ms"]) < 0.05 * steps["time_ms"] + 0.2).all()


def test_light_capture_keeps_attribution_without_profiler(tmp_path: Path) -> None:
    run = profile_builtin("small_cnn", tmp_path, steps=1, warmup=1, batch_size=2, light=True)
    assert run.status == "complete"
    assert not run.has_table("ops")
    prims = run.primitives
    assert prims.height > 0
    assert prims["module"].null_count() == 0
    assert prims["op"].null_count() == prims.height
    assert run.steps["allocations"].null_count() == 1


def test_script_output_reaches_terminal_not_tables(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    script = _script(tmp_path, steps=4)
    run, code = profile_script(["python", str(script)], tmp_path / "runs", steps=2, warmup=1)
    out = capfd.readouterr().out
    assert code == 0
    assert run.status == "complete"
    assert all(f"user step {i}" in out for i in range(4))
    assert "onednn_verbose" not in out
    assert run.steps.height == 2
    log = run.verbose_log.read_text()
    assert "user step" not in log
    prims = run.primitives
    assert prims.height > 0 and set(prims["phase"].unique()) <= {"forward", "backward", "loss", "optimizer", "data", "other"}
    # Module names come from the script's own model.
    assert "0" in set(run.layers["module"])


WORKER_SCRIPT = """
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Jitter(nn.Module):  # a transform as torchvision writes them: a module without parameters
    def forward(self, x):
        return x + 0.01 * torch.randn_like(x)


class Images(Dataset):
    def __init__(self):
        self.jitter = Jitter()

    def __len__(self):
        return 32

    def __getitem__(self, i):
        if i == 0:
            print("worker item", flush=True)
        g = torch.Generator().manual_seed(i)
        return self.jitter(torch.randn(3, 8, 8, generator=g)), i % 4


torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 8 * 8, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Images(), batch_size=4, num_workers=1, multiprocessing_context="fork")
for x, y in loader:
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
"""


def test_forked_dataloader_workers_stay_out_of_the_run(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    """A DataLoader worker forked from the profiled script runs its transforms unobserved: no
    markers of its own in the log, no layer of the step, and its prints reach the terminal."""
    script = tmp_path / "train.py"
    script.write_text(WORKER_SCRIPT)
    run, code = profile_script(["python", str(script)], tmp_path / "runs", steps=2, warmup=1)
    out = capfd.readouterr().out
    assert code == 0 and run.status == "complete"
    assert not any("Jitter" in m for m in run.layers["module"].unique()), run.layers["module"].unique()
    log = run.verbose_log.read_text()
    assert "Jitter" not in log and "worker item" not in log
    assert "worker item" in out
    assert {"0", "1", "3"} <= set(run.layers["module"])


def test_script_that_raises_keeps_failed_run(tmp_path: Path) -> None:
    script = _script(tmp_path, steps=3, tail='raise RuntimeError("boom in user code")\n')
    run, code = profile_script(["python", str(script)], tmp_path / "runs", steps=1, warmup=1)
    assert code == 1
    manifest = json.loads((run.path / "manifest.json").read_text())
    assert manifest["status"] == "failed"
    assert "boom in user code" in manifest["error"]
    assert "RuntimeError" in manifest["traceback"]
    assert manifest["exit_code"] == 1
    assert load_run(run.path).steps.height == 1  # what was captured is kept


def test_script_exit_code_is_returned(tmp_path: Path) -> None:
    script = _script(tmp_path, steps=2, tail="sys.exit(3)\n")
    run, code = profile_script(["python", str(script)], tmp_path / "runs", steps=1, warmup=1)
    assert code == 3 and run.status == "failed" and run.manifest["exit_code"] == 3


def test_script_that_exits_zero_completes_without_an_error(tmp_path: Path) -> None:
    script = _script(tmp_path, steps=2, tail="sys.exit(0)\n")
    run, code = profile_script(["python", str(script)], tmp_path / "runs", steps=1, warmup=1)
    manifest = load_run(run.path).manifest
    assert code == 0 and manifest["status"] == "complete" and manifest["exit_code"] == 0
    assert "error" not in manifest and "traceback" not in manifest


def test_a_failure_of_profilednn_itself_propagates_and_is_not_the_scripts(tmp_path: Path, monkeypatch) -> None:
    from profilednn.capture import session as session_module

    def broken_fingerprint() -> dict:
        raise OSError("cannot read /proc/cpuinfo")

    monkeypatch.setattr(session_module, "fingerprint", broken_fingerprint)
    script = _script(tmp_path, steps=2)
    with pytest.raises(OSError, match="cpuinfo") as caught:
        profile_script(["python", str(script)], tmp_path / "runs", steps=1, warmup=1)
    assert caught.value.run.status == "failed"  # the Run still ends, and says why


def test_interrupt_keeps_run_as_interrupted(tmp_path: Path) -> None:
    script = _script(tmp_path, steps=3, tail="raise KeyboardInterrupt\n")
    run, code = profile_script(["python", str(script)], tmp_path / "runs", steps=1, warmup=1)
    assert code == 130 and run.status == "interrupted"
    assert run.steps.height == 1


def test_script_without_optimizer_is_profiled_by_wall_time(tmp_path: Path) -> None:
    script = tmp_path / "infer.py"
    script.write_text("import torch\nm = torch.nn.Conv2d(3, 8, 3, padding=1)\nfor _ in range(2):\n"
                      "    m(torch.randn(2, 3, 16, 16))\n")
    run, code = profile_script(["python", str(script)], tmp_path / "runs", steps=2, warmup=1)
    assert code == 0 and run.status == "complete"
    assert run.steps.height == 1
    assert sum("optimizer.step()" in n for n in run.manifest["notes"]) == 1
    assert run.primitives.filter(pl.col("driver") == "conv").height == 2


def test_unwritable_runs_dir_fails_before_workload_starts(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        target = Path("/proc/profilednn-cannot-write-here")
    else:
        target = tmp_path / "ro"
        target.mkdir()
        target.chmod(0o500)
    marker = tmp_path / "ran.txt"
    script = tmp_path / "s.py"
    script.write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    with pytest.raises(RunError):
        profile_script(["python", str(script)], target, steps=1, warmup=0)
    assert not marker.exists()


def test_api_capture_context(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 6 * 6, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(2, 3, 8, 8), torch.tensor([0, 1])
    with capture(tmp_path, model=model, optimizer=opt, warmup=1) as cap:
        for _ in range(3):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            cap.step(loss)
    run = load_run(cap.run.path)
    assert run.status == "complete"
    assert run.steps.height == 2
    assert run.steps["loss"].null_count() == 0
    layers = set(run.layers["module"])
    assert {"0", "3"} <= layers
    conv = run.primitives.filter(pl.col("driver") == "conv")
    assert set(conv["module"]) == {"0"}


def test_api_capture_failure_marks_run_failed(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        with capture(tmp_path) as cap:
            raise ValueError("user bug")
    assert load_run(cap.run.path).status == "failed"


def test_cli_profile_unknown_model_lists_choices(capsys: pytest.CaptureFixture) -> None:
    code = run_cli(["profile", "--model", "nosuchnet", "-o", "/tmp/profilednn-test-runs"])
    err = capsys.readouterr().err
    assert code == 1
    assert "resnet50" in err and "small_cnn" in err


def test_cli_profile_prints_table_and_run_path(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code = run_cli(["profile", "--model", "small_cnn", "--batch-size", "2", "--steps", "1",
                    "--warmup", "1", "-o", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    assert "forward ms" in out and "backward ms" in out
    assert "optimizer" in out and "loss" in out and "data" in out
    assert f"Run: {tmp_path}" in out


def test_cli_profile_script_nonzero_exit_propagates(tmp_path: Path) -> None:
    script = _script(tmp_path, steps=2, tail="sys.exit(4)\n")
    code = run_cli(["profile", "--steps", "1", "-o", str(tmp_path / "runs"), "--", "python", str(script)])
    assert code == 4


@pytest.mark.parametrize(
    "name,knobs",
    [
        ("small_cnn", {"batch_size": 2}),
        pytest.param("resnet50", {"batch_size": 2, "image_size": 32}, marks=pytest.mark.zoo),
        pytest.param("resnext50_32x4d", {"batch_size": 2, "image_size": 32}, marks=pytest.mark.zoo),
        pytest.param("alexnet", {"batch_size": 1, "image_size": 64}, marks=pytest.mark.zoo),
        pytest.param("retinanet_resnext50_fpn", {"batch_size": 1, "image_size": 128, "num_classes": 91},
                     marks=pytest.mark.zoo),
        ("bert_base", {"batch_size": 1, "seq_len": 8, "layers": 2}),
        ("lstm_lm", {"batch_size": 2, "seq_len": 4}),
    ],
)
def test_every_builtin_workload_profiles(tmp_path: Path, name: str, knobs: dict) -> None:
    run = profile_builtin(name, tmp_path, steps=1, warmup=1, **knobs)
    assert run.status == "complete", run.manifest.get("error")
    assert run.steps.height == 1
    assert run.layers.filter(pl.col("phase") == "forward").height > 0
    assert run.layers.filter(pl.col("phase") == "backward").height > 0
    assert run.ops.height > 0


def test_steps_count_the_mib_glibc_maps_afresh(tmp_path: Path) -> None:
    # A 40 MiB activation (and its gradient) a step: above glibc's largest mmap threshold
    # (32 MiB), so the default allocator maps and faults it in every step; 8 KiB ones are not counted.
    torch.manual_seed(0)
    model = torch.nn.Linear(1024, 1024)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(10 * 1024, 1024)  # the output: 10 Ki x 1 Ki fp32 = 40 MiB
    with capture(tmp_path, model=model, optimizer=opt, warmup=1) as cap:
        for _ in range(3):
            opt.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            cap.step(loss)
    steps = load_run(cap.run.path).steps
    assert steps.height == 2 and (steps["allocations"] > 0).all()
    mib = steps["mapped_alloc_mib"].to_list()
    assert all(80 <= m < 400 and m % 40 == 0 for m in mib), mib  # whole 40 MiB buffers: outputs and gradients


@pytest.mark.parametrize("light", [True, False])
def test_page_faults_are_counted_per_step_and_the_profiled_steps_marked(tmp_path, light):
    # Each step fills a freshly mapped 64 MiB region (an anonymous mmap, not malloc: a
    # long-lived test process may hold a free heap hole that big) and the kernel faults in
    # all 16,384 of its 4 KiB pages, every step.
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with capture(tmp_path, model=model, optimizer=opt, warmup=2, steps=2, light=light) as cap:
        for _ in range(4):
            touch_fresh_memory(64 * 2**20)
            opt.zero_grad()
            loss = model(torch.ones(2, 4)).sum()
            loss.backward()
            opt.step()
            cap.step(loss)
    record = load_run(cap.run.path).manifest["page_faults"]
    page = record["page_bytes"]
    assert len(record["per_step"]) == 4
    assert all(n >= 0.9 * 64 * 2**20 / page for n in record["per_step"]), record
    # capture() watches its warm-up steps too (then drops them); profile runs them unwatched
    assert record["profiled"] == [not light] * 4
    if not light:
        run = profile_builtin("small_cnn", tmp_path / "builtin", steps=1, warmup=2, batch_size=2)
        assert run.manifest["page_faults"]["profiled"] == [False, False, True]


def test_an_op_holding_a_marker_takes_the_state_after_it_whatever_its_share() -> None:
    """autograd's evaluate_function range opens before the node's pre-hook writes the module's
    backward marker: a hook that waited for the CPU puts the marker late in the op (83% here),
    and the op is still the module's."""
    states = pl.DataFrame({"line": [1, 2], "time_ms": [0.0, 10.0], "step": [0, 0],
                           "phase": ["backward", "backward"], "module": ["head", "drop"]})
    spans = pl.DataFrame(schema={"kind": pl.Utf8})
    events = pl.DataFrame({"op": ["aten::addmm", "autograd::engine::evaluate_function: MulBackward0", "aten::mul"],
                           "start_ms": [5.0, 9.0, 10.2], "dur_ms": [1.0, 1.2, 0.5]})
    got = attributed_events(events, Timeline(states=states, spans=spans), {"head": "Linear", "drop": "Dropout"})
    assert dict(zip(got["op"], got["module"])) == {
        "aten::addmm": "head", "autograd::engine::evaluate_function: MulBackward0": "drop", "aten::mul": "drop"}

"""Minor page faults per layer: every capture marker carries the process's fault count, so a
module's span (forward and backward) and the layers table know the faults inside it. Under
torch.profiler memory can fault in afresh where the program alone reuses it; these counts
say which layers' excess over the light reference is that. Checked in counts, never times."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
import torch
from torch import nn

from profilednn import load_run
from profilednn.capture import capture
from profilednn.capture.attribute import build_timeline
from profilednn.capture.capture_tables import layers_table
from profilednn.capture.page_faults import minor_faults
from profilednn.verbose.markers import Marker, format_marker, read_markers

from fresh_memory import touch_fresh_memory

REGION = 64 * 2**20  # bytes a faulting module touches afresh in each call: 16,384 4-KiB pages

needs_getrusage = pytest.mark.skipif(minor_faults() is None, reason="no getrusage: faults are not counted here")


def test_a_marker_carries_its_fault_count_and_the_arguments_stay_as_written(tmp_path: Path) -> None:
    log = tmp_path / "verbose.log"
    log.write_bytes(format_marker("fwd_begin,0,body.0", 1.0, faults=1234)
                    + b"onednn_verbose,primitive,exec,cpu,convolution\n"
                    + format_marker("fwd_end,0,body.0", 2.0)  # written without a count
                    + format_marker("fwd_begin,0,weird,pf=x", 3.0, faults=7))  # not a count: an argument
    first, second, third = read_markers(log)
    assert (first.line, first.event, first.args, first.faults) == (1, "fwd_begin", ["0", "body.0"], 1234)
    assert (second.line, second.args, second.faults) == (3, ["0", "body.0"], None)
    assert (third.args, third.faults) == (["0", "weird", "pf=x"], 7)


def _markers(seq: list[tuple[str, list[str], int | None]]) -> list[Marker]:
    return [Marker(i + 1, float(i), ev, args, faults) for i, (ev, args, faults) in enumerate(seq)]


def test_spans_and_the_layers_table_count_the_faults_inside_each_module() -> None:
    seq = [("win_open", ["0"], 100), ("fwd_begin", ["0", "net"], 100), ("fwd_begin", ["1", "net.fc"], 100),
           ("fwd_end", ["1", "net.fc"], 130), ("fwd_begin", ["1", "net.act"], 130),
           ("fwd_end", ["1", "net.act"], 5130), ("fwd_end", ["0", "net"], 5131),
           ("backward_begin", [], 5140), ("bwd_begin", ["net.act"], 5140), ("bwd_begin", ["net.fc"], 9140),
           ("backward_end", [], 9150), ("step_end", ["0"], 9160), ("win_close", [], 9160)]
    tl = build_timeline(_markers(seq), {"net": "Sequential", "net.fc": "Linear", "net.act": "GELU"})
    mods = {(r["name"], r["phase"]): r["faults"] for r in tl.spans.filter(pl.col("kind") == "module").iter_rows(named=True)}
    assert mods == {("net.fc", "forward"): 30, ("net.act", "forward"): 5000, ("net", "forward"): 5031,
                    ("net.act", "backward"): 4000, ("net.fc", "backward"): 10}
    phases = tl.spans.filter(pl.col("kind") == "phase").group_by("phase").agg(pl.col("faults").sum())
    assert dict(phases.iter_rows())["backward"] == 4010
    info = {"net": {"params": 0, "trainable_params": 0, "leaf": False},
            "net.fc": {"params": 4, "trainable_params": 4, "leaf": True},
            "net.act": {"params": 0, "trainable_params": 0, "leaf": True}}
    layers = layers_table(tl.spans, info)
    act = layers.filter(pl.col("module") == "net.act").sort("phase")
    assert act["faults"].to_list() == [4000, 5000]  # backward, forward
    # a log whose markers carry no counts: faults unknown, never 0
    bare = build_timeline(_markers([(ev, a, None) for ev, a, _ in seq]), {"net.act": "GELU"})
    assert layers_table(bare.spans, info)["faults"].null_count() == layers_table(bare.spans, info).height


class FreshMemory(nn.Module):
    """Touches a freshly mapped 64 MiB region in its forward: 16,384 minor faults a call."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        touch_fresh_memory(REGION)
        return x


@needs_getrusage
@pytest.mark.parametrize("light", [True, False])
def test_the_layer_that_faults_in_fresh_memory_has_its_faults_in_its_row(tmp_path: Path, light: bool) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), FreshMemory(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with capture(tmp_path, model=model, optimizer=opt, warmup=1, steps=2, light=light) as cap:
        for _ in range(3):
            opt.zero_grad()
            loss = model(torch.ones(2, 4)).sum()
            loss.backward()
            opt.step()
            cap.step(loss)
    layers = load_run(cap.run.path).layers.filter(pl.col("phase") == "forward")
    faults = {(m, s): f for m, s, f in layers.select("module", "step", "faults").iter_rows()}
    pages = REGION // 4096
    for step in (0, 1):
        assert faults[("1", step)] >= 0.9 * pages  # the module that touched the region
        assert faults[("0", step)] < pages // 10 and faults[("2", step)] < pages // 10

"""A module whose output is its input (``Dropout(p=0)``, as every layer of transformers' ViTMAE
has, ``Identity``) has no backward of its own: the backward of the layer before it stays that
layer's. An in-place module (``ReLU(inplace=True)``) keeps its own. Which layers, never times."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from profilednn import load_run, profile_script

SCRIPT = """
import torch
from torch import nn

torch.manual_seed(0)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.act = nn.ReLU(inplace=True)
        self.out = nn.Linear(16, 16)
        self.dropout = nn.Dropout(0.0)  # returns its input: no node of its own
        self.skip = nn.Identity()

    def forward(self, x):
        return self.skip(self.dropout(self.out(self.act(self.proj(x))))) + x


model = Block()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(8, 16)
for _ in range(5):
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()
"""


def test_a_pass_through_module_takes_no_backward_from_the_layer_before(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    run, code = profile_script(["python", str(script)], tmp_path / "runs", steps=2, warmup=1, stop_after=True)
    assert code == 0 and run.status == "complete", run.manifest.get("error")
    run = load_run(run.path)
    bwd = run.table("spans").filter((pl.col("kind") == "module") & (pl.col("phase") == "backward"))
    per_step = {m: sorted(bwd.filter(pl.col("name") == m)["step"].to_list()) for m in set(bwd["name"])}
    # before, the dropout and the identity were given (part of) the backward of `out` as theirs
    assert per_step == {"proj": [0, 1], "act": [0, 1], "out": [0, 1]}
    fwd = run.layers.filter(pl.col("phase") == "forward")
    assert {"dropout", "skip"} <= set(fwd["module"])  # still forward layers, called once a step

"""Which modules of an unmodified script are layers, and whose backward is whose. Names and
counts, never times.

- A dataset's ``nn.Module`` transforms (torchvision's are modules) run by a DataLoader in the
  script's own process (no workers, the HF ``Trainer``'s default) are data work: no layer of
  the model, no root name that would prefix the model's names.
- A module whose output is its input (``Dropout(p=0)``, as every layer of transformers'
  ViTMAE has, ``Identity``) has no backward of its own: the backward of the layer before it
  stays that layer's. An in-place module (``ReLU(inplace=True)``) keeps its own.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from profilednn import load_run, profile_script
from profilednn.run import Run
from profilednn.vocabulary import PSEUDO_MODULES

TRANSFORMS = """
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

torch.manual_seed(0)


class Jitter(nn.Module):  # a transform, as torchvision's RandomResizedCrop or Normalize
    def forward(self, x):
        return x + 0.01 * torch.randn_like(x)


class Images(Dataset):
    def __init__(self):
        self.transform = Jitter()

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return self.transform(torch.full((6,), float(i))), i % 3


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(torch.relu(self.fc(x)))


model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in DataLoader(Images(), batch_size=4, num_workers=0):
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
"""

PASS_THROUGH = """
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


def _profile(tmp_path: Path, text: str) -> Run:
    """``text`` as a script, profiled with one warm-up and two measured steps."""
    script = tmp_path / "train.py"
    script.write_text(text)
    run, code = profile_script(["python", str(script)], tmp_path / "runs", steps=2, warmup=1, stop_after=True)
    assert code == 0 and run.status == "complete", run.manifest.get("error")
    return load_run(run.path)


def test_transforms_called_by_the_dataloader_are_no_layers(tmp_path: Path) -> None:
    run = _profile(tmp_path, TRANSFORMS)
    assert run.steps.height == 2
    # the model is the first root seen: its names carry no prefix, and the transform is nowhere
    assert set(run.layers["module"]) - set(PSEUDO_MODULES) == {"Net", "fc", "head"}
    fwd = run.layers.filter((pl.col("phase") == "forward") & (pl.col("module") == "fc"))
    assert fwd["calls"].to_list() == [1, 1]
    spans = run.table("spans")
    assert not spans.filter(pl.col("name").str.contains("Jitter")).height
    assert spans.filter(pl.col("kind") == "eval").is_empty()


def test_a_pass_through_module_takes_no_backward_from_the_layer_before(tmp_path: Path) -> None:
    run = _profile(tmp_path, PASS_THROUGH)
    bwd = run.table("spans").filter((pl.col("kind") == "module") & (pl.col("phase") == "backward"))
    per_step = {m: sorted(bwd.filter(pl.col("name") == m)["step"].to_list()) for m in set(bwd["name"])}
    # before, the dropout and the identity were given (part of) the backward of `out` as theirs
    assert per_step == {"proj": [0, 1], "act": [0, 1], "out": [0, 1]}
    fwd = run.layers.filter(pl.col("phase") == "forward")
    assert {"dropout", "skip"} <= set(fwd["module"])  # still forward layers, called once a step

"""A dataset's ``nn.Module`` transforms (torchvision's are modules) run by a DataLoader in the
script's own process (no workers, the HF ``Trainer``'s default) are data work: no layer of the
model, no root name that would prefix the model's names. Counts and names, never times."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from profilednn import load_run, profile_script
from profilednn.vocabulary import PSEUDO_MODULES

SCRIPT = """
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


def test_transforms_called_by_the_dataloader_are_no_layers(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    run, code = profile_script(["python", str(script)], tmp_path / "runs", steps=2, warmup=1, stop_after=True)
    assert code == 0 and run.status == "complete", run.manifest.get("error")
    run = load_run(run.path)
    assert run.steps.height == 2
    # the model is the first root seen: its names carry no prefix, and the transform is nowhere
    assert set(run.layers["module"]) - set(PSEUDO_MODULES) == {"Net", "fc", "head"}
    fwd = run.layers.filter((pl.col("phase") == "forward") & (pl.col("module") == "fc"))
    assert fwd["calls"].to_list() == [1, 1]
    spans = run.table("spans")
    assert not spans.filter(pl.col("name").str.contains("Jitter")).height
    assert spans.filter(pl.col("kind") == "eval").is_empty()

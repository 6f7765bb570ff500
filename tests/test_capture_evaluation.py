"""Evaluation and sampling in a script's loop: outside the measured steps they leave nothing
in the capture; inside them they are no training layer's time. Counts, never times."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from profilednn import load_run, profile_script
from profilednn.run import Run
from profilednn.verbose.markers import read_markers

# A tiny char-level model trained by its own loop: every step after ``SAMPLE_AFTER`` the model
# samples tokens under torch.no_grad() in eval mode, as minGPT's chargpt callback does.
SCRIPT = """
import torch
from torch import nn

torch.manual_seed(0)
SAMPLE_AFTER = {sample_after}
SAMPLE_TOKENS = {tokens}


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.conv = nn.Conv1d(8, 8, 3, padding=1)
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(8, 16)

    def forward(self, idx):
        h = self.conv(self.embed(idx).transpose(1, 2)).transpose(1, 2)
        return self.head(self.drop(torch.relu(h)))


model = TinyLM()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = torch.randint(0, 16, (4, 12)), torch.randint(0, 16, (4, 12))
for it in range({steps}):
    logits = model(x)
    loss = nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
    model.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if it in SAMPLE_AFTER:
        model.eval()
        with torch.no_grad():
            idx = torch.zeros(1, 1, dtype=torch.long)
            for _ in range(SAMPLE_TOKENS):
                nxt = model(idx[:, -8:])[:, -1].softmax(-1).multinomial(1)
                idx = torch.cat([idx, nxt], 1)
        model.train()
"""


def _profile(tmp_path: Path, name: str, sample_after: tuple[int, ...], *, warmup: int, steps: int,
             light: bool = False) -> Run:
    script = tmp_path / f"{name}.py"
    script.write_text(SCRIPT.format(sample_after=set(sample_after) or "set()", tokens=30,
                                    steps=warmup + steps + 2))
    run, code = profile_script(["python", str(script)], tmp_path / name, steps=steps, warmup=warmup,
                               light=light, stop_after=True)
    assert code == 0 and run.status == "complete", run.manifest.get("error")
    return load_run(run.path)


def _counts(run: Run, *, layers_only: bool = False) -> dict[str, object]:
    """What a capture keeps, in counts: log lines, markers, records per table and step
    (``layers_only``: only what is attributed to a layer)."""
    log = run.path / "verbose.log"
    spans = run.table("spans").filter(pl.col("kind") == "module") if layers_only else run.table("spans")
    counts: dict[str, object] = {
        "primitives": sorted(run.primitives.select("module", "phase", "step").rows(), key=str),
        "spans": spans.height,
        "layer_calls": sorted(run.layers.filter(pl.col("module").is_in(list(spans["name"])) | (not layers_only))
                              .select("module", "phase", "step", "calls").rows(), key=str),
    }
    if not layers_only:
        counts.update(log_lines=sum(1 for _ in open(log, "rb")), markers=len(read_markers(log)))
    if run.has_table("op_events"):
        # every op, torch's own range around optimizer.step() too: it holds the post-hook that
        # ends ProfileDNN's step, and takes the state of its first marker, the optimizer's
        ev = run.table("op_events")
        if layers_only:
            ev = ev.filter(pl.col("module").is_in(list(spans["name"])))
        counts["op_events"] = sorted(ev.select("op", "module", "phase", "step").rows(), key=str)
        if not layers_only:
            counts["allocations"] = run.steps["allocations"].to_list()
    return counts


@pytest.mark.parametrize("light", [False, True])
def test_sampling_in_warm_up_leaves_the_measured_steps_unchanged(tmp_path: Path, light: bool) -> None:
    # sampling after step 0, inside the warm-up (before the window), as chargpt does at iteration 0
    plain = _profile(tmp_path, "plain", (), warmup=2, steps=2, light=light)
    sampled = _profile(tmp_path, "sampled", (0,), warmup=2, steps=2, light=light)
    assert plain.steps.height == sampled.steps.height == 2
    assert _counts(sampled) == _counts(plain)
    assert sampled.manifest["capture"]["events"] == plain.manifest["capture"]["events"]
    # torch.profiler watched the measured steps only
    assert sampled.manifest["page_faults"]["profiled"] == [False, False, not light, not light]
    assert not any("no_grad" in n for n in sampled.manifest["notes"])


def test_a_no_grad_forward_inside_the_window_is_an_evaluation_not_a_layer(tmp_path: Path) -> None:
    plain = _profile(tmp_path, "plain", (), warmup=1, steps=2)
    sampled = _profile(tmp_path, "sampled", (1,), warmup=1, steps=2)  # after the first measured step
    # every record of a layer as without the sampling: no primitive, op or call of it added
    assert _counts(sampled, layers_only=True) == _counts(plain, layers_only=True)
    fwd = sampled.layers.filter((pl.col("phase") == "forward") & (pl.col("module") == "head"))
    assert fwd["calls"].to_list() == [1, 1]  # the training forward only, in both steps
    evals = sampled.table("spans").filter(pl.col("kind") == "eval")
    # sampling runs after step 1's optimizer.step(): it opens the next step (measured index 1)
    assert evals.height == 30 and set(evals["step"]) == {1} and set(evals["phase"]) == {"other"}
    assert set(evals["name"]) == {"TinyLM"}
    (note,) = [n for n in sampled.manifest["notes"] if "no_grad" in n]
    assert note.startswith("30 forward calls of the trained model under torch.no_grad()")
    step1 = sampled.steps.filter(pl.col("step") == 1).row(0, named=True)
    assert step1["other_ms"] >= float((evals["end_ms"] - evals["start_ms"]).sum()) * 0.999


def test_a_frozen_model_under_no_grad_stays_a_forward(tmp_path: Path) -> None:
    # a teacher (no parameter of it trained) called under no_grad inside the step is training work
    script = tmp_path / "distill.py"
    script.write_text(
        "import torch\nfrom torch import nn\ntorch.manual_seed(0)\n"
        "teacher, student = nn.Linear(6, 3), nn.Linear(6, 3)\n"
        "opt = torch.optim.SGD(student.parameters(), lr=0.1)\nx = torch.randn(4, 6)\n"
        "for _ in range(4):\n    with torch.no_grad():\n        target = teacher(x)\n"
        "    opt.zero_grad()\n    nn.functional.mse_loss(student(x), target).backward()\n    opt.step()\n")
    run, code = profile_script(["python", str(script)], tmp_path / "runs", steps=2, warmup=1)
    assert code == 0
    run = load_run(run.path)
    fwd = run.layers.filter(pl.col("phase") == "forward")
    assert sorted(set(fwd["module"])) == ["Linear", "Linear1"]
    assert run.table("spans").filter(pl.col("kind") == "eval").is_empty()

"""Capture under real training stacks: torch.compile, Lightning, HF Trainer, timm.

Each stack runs an unmodified small script through ``profile_script`` (in this process,
as ``profilednn profile -- python train.py`` does). No weights or data are downloaded:
the models are built from configs with random weights.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import polars as pl
import pytest
import torch
from torch import nn

from profilednn.analysis.actions import check_action, optimizer_fix, snippet_callables
from profilednn.analysis.rules import RULES
from profilednn.analysis.facade import Analysis
from profilednn.capture import profile_script
from profilednn.capture.attribute import build_timeline
from profilednn.verbose.markers import Marker
from profilednn.capture.hooks import COMPILED_SUFFIX, Instrumentation, ModuleNames, find_outermost_parent
from profilednn.run import Run

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Ops that compute a layer: none may land in the optimizer phase.
_LAYER_OPS = ("convolution", "addmm", "linear", "matmul", "bmm", "CompiledFunction")


def _profile(tmp_path: Path, body: str, **kw: object) -> tuple[Run, int]:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(body))
    return profile_script(["python", str(script)], tmp_path / "runs", **kw)  # type: ignore[arg-type]


def _assert_profiled_right(run: Run, code: int) -> pl.DataFrame:
    """What the issue asks of every stack: complete, >= 3 steps, real phases, attributed."""
    assert code == 0, run.manifest.get("traceback")
    assert run.status == "complete", run.manifest.get("error")
    assert "instrumentation_error" not in run.manifest
    steps = run.steps
    assert steps.height >= 3
    assert (steps["forward_ms"] > 0).all() and (steps["backward_ms"] > 0).all()
    # The optimizer phase is only the update: no layer computation is counted in it.
    ops = run.ops
    in_opt = ops.filter((pl.col("phase") == "optimizer")
                        & pl.col("op").str.contains("|".join(_LAYER_OPS)))
    assert in_opt.is_empty(), in_opt
    assert {"forward", "backward"} <= set(ops["phase"].drop_nulls())
    prims = run.primitives
    assert prims.height > 0
    assert prims["phase"].null_count() == 0 and prims["step"].null_count() == 0
    assert prims["op"].null_count() < prims.height  # joined to the framework ops
    return steps


# ------------------------------------------------------------------------- torch.compile
COMPILED = """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 8 * 8, 4))
cmodel = torch.compile(model{backend})
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(2, 3, 8, 8), torch.tensor([0, 1])
for _ in range(5):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(cmodel(x), y)
    loss.backward()
    opt.step()
"""


def test_compiled_model_names_wrapper_as_a_region() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    names = ModuleNames()
    names.register_root(torch.compile(model))
    assert set(names.info) == {f"Sequential{COMPILED_SUFFIX}", "Sequential", "0", "1"}
    region = names.info[f"Sequential{COMPILED_SUFFIX}"]
    assert region["compiled"] and region["leaf"] and region["params"] == 0  # no double count


@pytest.mark.slow
def test_compiled_model_runs_unchanged_and_is_profiled(tmp_path: Path, recwarn: pytest.WarningsRecorder) -> None:
    torch._dynamo.reset()
    run, code = _profile(tmp_path, COMPILED.format(backend=""), steps=3, warmup=1)
    steps = _assert_profiled_right(run, code)
    assert not [w for w in recwarn if "global hooks" in str(w.message)]
    region = f"Sequential{COMPILED_SUFFIX}"
    layers = run.layers
    assert set(layers.filter(pl.col("module") == region)["phase"]) == {"forward", "backward"}
    assert any("torch.compile" in n and "not possible" in n for n in run.manifest["notes"])
    # Inductor's graphs and the oneDNN convolutions they call belong to the region.
    ops = run.ops.filter(pl.col("module") == region)
    assert ops.filter(pl.col("op").str.contains("CompiledFunction")).height > 0
    assert set(run.primitives["module"]) == {region}
    assert steps["loss"].null_count() == 0


def test_dynamo_sees_the_same_graphs_under_capture(tmp_path: Path) -> None:
    """The hooks add no graph break and no graph: Dynamo compiles the same thing."""
    from torch._dynamo.utils import counters

    def compiled_stats(fn: object) -> tuple[int, int]:
        torch._dynamo.reset()
        counters.clear()
        fn()  # type: ignore[operator]
        return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())

    body = COMPILED.format(backend=', backend="aot_eager"')
    script = tmp_path / "plain.py"
    script.write_text(body)
    plain = compiled_stats(lambda: exec(compile(body, str(script), "exec"), {"__name__": "__main__"}))
    profiled = compiled_stats(lambda: profile_script(["python", str(script)], tmp_path / "runs",
                                                     steps=2, warmup=1))
    assert profiled == plain
    assert plain[1] == 0


# ------------------------------------------------------------------------- closures
def test_closure_step_phases_from_what_runs() -> None:
    """opt.step(closure) running forward and backward: only the update is optimizer time."""
    seq = [("win_open", ["0"]), ("opt_begin", ["step"]), ("opt_begin", ["zero_grad"]),
           ("opt_end", ["zero_grad"]), ("fwd_begin", ["0", "net"]), ("fwd_end", ["0", "net"]),
           ("backward_begin", []), ("backward_end", []), ("opt_end", ["step"]),
           ("step_end", ["0"]), ("win_close", [])]
    times = [0, 1, 2, 3, 5, 15, 18, 40, 44, 45, 46]
    markers = [Marker(i + 1, float(t), ev, a) for i, ((ev, a), t) in enumerate(zip(seq, times))]
    tl = build_timeline(markers, {"net": "Linear"})
    phases = tl.spans.filter(pl.col("kind") == "phase").group_by("phase").agg(
        (pl.col("end_ms") - pl.col("start_ms")).sum().alias("ms"))
    ms = dict(phases.iter_rows())
    assert ms["forward"] == 10 and ms["loss"] == 3 and ms["backward"] == 22
    assert ms["optimizer"] == 1 + 4  # zero_grad, and the update after the backward
    # before zero_grad, between it and the forward, after the step returns
    assert ms["other"] == 1 + 2 + 1 and ms["data"] == 1 + 1


LBFGS_ACCUM = """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 8 * 8, 4))
x, y = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 3])
opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=2)
def closure():
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return loss
for _ in range(4):
    opt.step(closure)
"""


def test_lbfgs_closure_keeps_forward_and_backward(tmp_path: Path) -> None:
    run, code = _profile(tmp_path, LBFGS_ACCUM, steps=3, warmup=1)
    steps = _assert_profiled_right(run, code)
    assert (steps["optimizer_ms"] < steps["time_ms"]).all()
    assert run.manifest["optimizers"][0]["class"] == "LBFGS"


ACCUM_TWO_OPTS_AMP = """
import torch
from torch import nn
torch.manual_seed(0)
body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten())
head = nn.Linear(8 * 8 * 8, 4)
opt_a = torch.optim.SGD(body.parameters(), lr=0.01)
opt_b = torch.optim.Adam(head.parameters(), lr=0.01)
scaler = torch.amp.GradScaler("cpu")
x, y = torch.randn(2, 3, 8, 8), torch.tensor([0, 1])
for step in range(5):
    for micro in range(2):  # gradient accumulation: two backward per optimizer step
        loss = nn.functional.cross_entropy(head(body(x)), y) / 2
        scaler.scale(loss).backward()
    scaler.step(opt_a)
    scaler.step(opt_b)
    scaler.update()
    opt_a.zero_grad()
    opt_b.zero_grad()
"""


def test_accumulation_two_optimizers_and_grad_scaler(tmp_path: Path) -> None:
    run, code = _profile(tmp_path, ACCUM_TWO_OPTS_AMP, steps=3, warmup=1)
    steps = _assert_profiled_right(run, code)
    assert steps.height == 3  # one step per step of the first optimizer, not per backward
    bwd = run.layers.filter((pl.col("phase") == "backward") & (pl.col("module") == "0"))
    assert (bwd["calls"] == 2).all()  # both micro-batches' backward in each step
    assert {o["class"] for o in run.manifest["optimizers"]} == {"SGD", "Adam"}


# ------------------------------------------------------------------------- Lightning
LIGHTNING = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import pytorch_lightning as pl
torch.manual_seed(0)
class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 8 * 8, 4))
    def training_step(self, batch, i):
        x, y = batch
        return nn.functional.cross_entropy(self.body(x), y)
    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)
data = TensorDataset(torch.randn(24, 3, 8, 8), torch.randint(0, 4, (24,)))
trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, limit_train_batches=5)
trainer.fit(Tiny(), DataLoader(data, batch_size=4))
"""


def test_lightning_trainer_phases_names_and_advice(tmp_path: Path) -> None:
    pytest.importorskip("pytorch_lightning")
    run, code = _profile(tmp_path, LIGHTNING, steps=3, warmup=1)
    steps = _assert_profiled_right(run, code)
    # The closure's forward and backward are not optimizer time: the layers' ops run in
    # forward/backward in every step, the optimizer phase holds Adam's update.
    ops = run.ops.filter(pl.col("step").is_not_null())
    fwd = ops.filter((pl.col("phase") == "forward") & pl.col("op").is_in(["aten::convolution", "aten::linear"]))
    assert fwd.group_by("step").len()["len"].to_list() == [2] * steps.height
    opt_ops = set(ops.filter(pl.col("phase") == "optimizer")["op"])
    assert {"aten::addcdiv_", "aten::lerp_"} <= opt_ops, opt_ops
    modules = set(run.layers["module"])
    assert {"body.0", "body.3"} <= modules and "0" not in modules  # parents kept
    advice = [RULES[r](Analysis(run.path)) for r in RULES]
    for a in advice:
        if a is not None:
            assert not check_action(a.action), a.action


# ------------------------------------------------------------------------- HF Trainer
HF_TRAINER = """
import os
import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
torch.manual_seed(0)
cfg = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                 intermediate_size=32, max_position_embeddings=16, num_labels=2)
class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 24
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {"input_ids": torch.randint(0, 64, (8,), generator=g), "labels": torch.tensor(i % 2)}
args = TrainingArguments(output_dir=os.path.join(os.path.dirname(os.path.abspath(__file__)), "out"),
                         max_steps=5, per_device_train_batch_size=4, report_to=[], save_strategy="no",
                         logging_strategy="no", use_cpu=True, disable_tqdm=True)
Trainer(model=BertForSequenceClassification(cfg), args=args, train_dataset=Data()).train()
"""


def test_hf_trainer_tiny_bert(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    run, code = _profile(tmp_path, HF_TRAINER, steps=3, warmup=1)
    _assert_profiled_right(run, code)
    modules = set(run.layers["module"])
    assert any(m.startswith("bert.encoder.layer.0") for m in modules)


# ------------------------------------------------------------------------- timm
TIMM_LAMB = """
import torch
import timm
from timm.optim import create_optimizer_v2
torch.manual_seed(0)
model = timm.create_model("test_resnet", pretrained=False, num_classes=4)
opt = create_optimizer_v2(model, opt="lamb", lr=1e-3, weight_decay=0.01)
x, y = torch.randn(2, 3, 32, 32), torch.tensor([0, 1])
for _ in range(5):
    opt.zero_grad()
    nn_loss = torch.nn.functional.cross_entropy(model(x), y)
    nn_loss.backward()
    opt.step()
"""


def test_timm_lamb_gets_advice_that_names_real_apis(tmp_path: Path) -> None:
    pytest.importorskip("timm")
    run, code = _profile(tmp_path, TIMM_LAMB, steps=3, warmup=1)
    _assert_profiled_right(run, code)
    (record,) = run.manifest["optimizers"]
    assert (record["module"], record["class"]) == ("timm.optim.lamb", "Lamb")
    fix = optimizer_fix(record)
    assert fix is not None and fix.snippet is not None
    assert snippet_callables(fix.action()) == ["profilednn.kernels.FusedLAMB"]
    advice = RULES["fused_optimizer"](Analysis(run.path))
    if advice is not None:  # only when the update is a large share on this machine
        assert "profilednn.kernels.FusedLAMB" in advice.action and "torch.optim.Lamb" not in advice.action


# ------------------------------------------------------------------------- actions
@pytest.mark.parametrize(("record", "expected", "keyword"), [
    ({"class": "Adam", "module": "torch.optim.adam", "fused": None}, "torch.optim.Adam", "fused=True"),
    ({"class": "SGD", "module": "torch.optim.sgd", "fused": False}, "torch.optim.SGD", "fused=True"),
    ({"class": "Lamb", "module": "timm.optim.lamb"}, "profilednn.kernels.FusedLAMB", "weight_decay"),
    ({"class": "AdamW", "module": "some_lib.optim"}, "torch.optim.AdamW", "fused=True"),
    ({"class": "Rprop", "module": "torch.optim.rprop", "foreach": None}, "torch.optim.Rprop", "foreach=True"),
    ({"class": "Shampoo", "module": "some_lib.optim", "accepts_foreach": False}, "torch.compile", ""),
])
def test_optimizer_actions_name_importable_callables(record: dict[str, object], expected: str,
                                                     keyword: str) -> None:
    fix = optimizer_fix(record)
    assert fix is not None
    assert snippet_callables(fix.action()) == [expected]
    assert not check_action(fix.action())
    assert keyword in fix.action()


def test_no_action_for_an_optimizer_that_already_runs_fused() -> None:
    assert optimizer_fix({"class": "AdamW", "module": "torch.optim.adamw", "fused": True}) is None


def test_check_action_catches_an_api_that_does_not_exist() -> None:
    assert check_action("Use `torch.optim.Lamb(params, ..., fused=True)`.") == ["torch.optim.Lamb"]


# ------------------------------------------------------------------------- transparency
def test_parent_module_found_from_the_caller() -> None:
    class Wrapper(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(nn.Linear(2, 2))

        def outer(self) -> nn.Module:
            return find_outermost_parent(self.body)

    w = Wrapper()
    assert w.outer() is w
    assert find_outermost_parent(w.body) is w.body  # no caller holds it here


def test_fault_in_instrumentation_never_breaks_the_program(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: ModuleNames, module: nn.Module) -> None:
        raise RuntimeError("profiler bug")

    monkeypatch.setattr(ModuleNames, "register_called_root", broken)
    run, code = _profile(tmp_path, LBFGS_ACCUM.replace("for _ in range(4)", "for _ in range(2)")
                         + "print('finished', flush=True)\n", steps=1, warmup=0)
    assert code == 0 and run.status == "complete"
    assert "profiler bug" in run.manifest["instrumentation_error"]
    assert any("instrumentation failed" in n for n in run.manifest["notes"])


def test_script_traceback_reaches_stderr_as_python_prints_it(
        tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    run, code = _profile(tmp_path, "def helper():\n    raise ValueError('boom in user code')\nhelper()\n",
                         steps=1, warmup=0)
    err = capfd.readouterr().err
    assert code == 1 and run.status == "failed"
    assert err.startswith("Traceback (most recent call last):")
    assert 'train.py", line 3, in <module>' in err and "ValueError: boom in user code" in err
    assert "runpy" not in err and "profilednn" not in err


def test_instrumentation_leaves_no_global_hook_behind() -> None:
    before = nn.modules.module._has_any_global_hook
    inst = Instrumentation()
    inst.install()
    try:
        assert not nn.modules.module._has_any_global_hook()  # ours are not the user's
        handle = nn.modules.module.register_module_forward_hook(lambda m, a, o: None)
        assert nn.modules.module._has_any_global_hook()
        handle.remove()
    finally:
        inst.remove()
    assert nn.modules.module._has_any_global_hook is before


def test_every_rule_action_names_importable_callables(tmp_path: Path) -> None:
    """Each rule fires on its synthetic Run; every callable its action's code names imports."""
    from test_advice import CASES

    from profilednn.analysis import advise
    from runfactory import make_run

    for i, (rule, (fire, _)) in enumerate(sorted(CASES.items())):
        for advice in advise(Analysis(make_run(tmp_path / str(i), **fire).path)):
            assert not check_action(advice.action), (advice.rule, advice.action)
    fused = [a for a in advise(Analysis(make_run(tmp_path / "opt", **CASES["fused_optimizer"][0]).path))
             if a.rule == "fused_optimizer"]
    assert fused and snippet_callables(fused[0].action)  # it names real code, checked above

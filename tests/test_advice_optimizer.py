"""``fused_optimizer``: fires for torch's Adam/AdamW/SGD built without ``fused=``/``foreach=``
when the optimizer phase is >= 5% of the step; quiet when they are set or the phase is small.
Synthetic Runs for each case, and real captured scripts."""

from __future__ import annotations

from pathlib import Path

import pytest
from runfactory import make_run

from profilednn import profile_script
from profilednn.analysis import Analysis, advise
from profilednn.analysis.actions import check_action
from profilednn.analysis.optimizer_rules import FUSED_OPTIMIZER_SAVING, OPTIMIZER_SHARE_MIN_PCT, already_fast

ADAMW = {"class": "AdamW", "module": "torch.optim.adamw", "accepts_fused": True, "accepts_foreach": True,
         "fused": None, "foreach": None, "differentiable": False, "params": 1000}
SCRIPT_ARGV = ("python", "train.py")


def _fired(run) -> dict:
    return {a.rule: a for a in advise(Analysis(run.path))}


def _share(run) -> float:
    a = Analysis(run.path)
    return float(a.steps["optimizer_ms"].mean()) / a.step_ms * 100.0


def test_fires_for_an_unfused_adamw_from_five_percent_of_the_step(tmp_path: Path) -> None:
    # per-parameter ops at about 8% of the step: under the old 10% threshold, over the new 5%
    run = make_run(tmp_path, optimizer="per_param", optimizer_scale=30.0, optimizers=(ADAMW,),
                   script_argv=SCRIPT_ARGV)
    share = _share(run)
    assert OPTIMIZER_SHARE_MIN_PCT <= share < 10.0
    adv = _fired(run)["fused_optimizer"]
    assert "torch.optim.adamw.AdamW, built without fused= or foreach=" in adv.evidence
    assert adv.estimated_gain_pct == pytest.approx(share * FUSED_OPTIMIZER_SAVING, rel=1e-6)
    assert "`torch.optim.AdamW(params, ..., fused=True)`" in adv.action
    assert "`profilednn optimize -- python train.py` (recipe fused_optimizer)" in adv.action
    assert not check_action(adv.action)


@pytest.mark.parametrize("record", [
    {**ADAMW, "fused": True},
    {**ADAMW, "foreach": True},
    {**ADAMW, "differentiable": True},
    {**ADAMW, "class": "SGD", "module": "torch.optim.sgd", "foreach": True},
])
def test_quiet_when_fused_or_foreach_is_already_set(record: dict, tmp_path: Path) -> None:
    run = make_run(tmp_path, optimizer="per_param", optimizer_scale=60.0, optimizers=(record,))
    assert already_fast(record) is not None
    assert "fused_optimizer" not in _fired(run)
    # the same phase with the constructor's defaults does fire
    assert "fused_optimizer" in _fired(make_run(tmp_path, optimizer="per_param", optimizer_scale=60.0,
                                                optimizers=({**record, "fused": None, "foreach": None,
                                                             "differentiable": None},)))


def test_quiet_when_the_phase_is_small(tmp_path: Path) -> None:
    run = make_run(tmp_path, optimizer="per_param", optimizer_scale=10.0, optimizers=(ADAMW,))
    assert _share(run) < OPTIMIZER_SHARE_MIN_PCT
    assert "fused_optimizer" not in _fired(run)


def test_without_a_record_the_op_names_decide(tmp_path: Path) -> None:
    # an older Run: no manifest["optimizers"]; _foreach_ ops are the multi-tensor path already
    assert "fused_optimizer" not in _fired(make_run(tmp_path, optimizer="foreach", optimizer_scale=60.0))
    adv = _fired(make_run(tmp_path, optimizer="per_param", optimizer_scale=60.0))["fused_optimizer"]
    assert "`torch.optim.SGD(params, ..., fused=True)`" in adv.action


def test_a_run_that_does_not_say_which_optimizer_ran_gets_no_guess(tmp_path: Path) -> None:
    # a light capture has no op names: only capture's record can name the optimizer
    quiet = make_run(tmp_path, light=True, optimizer="per_param", optimizer_scale=60.0)
    assert _share(quiet) >= OPTIMIZER_SHARE_MIN_PCT and "fused_optimizer" not in _fired(quiet)
    named = make_run(tmp_path, light=True, optimizer="per_param", optimizer_scale=60.0, optimizers=(ADAMW,))
    assert "torch.optim.AdamW(params, ..., fused=True)" in _fired(named)["fused_optimizer"].action


def test_one_fused_optimizer_beside_an_unfused_one_still_gets_advice(tmp_path: Path) -> None:
    sgd = {**ADAMW, "class": "SGD", "module": "torch.optim.sgd"}
    run = make_run(tmp_path, optimizer="per_param", optimizer_scale=60.0, optimizers=({**ADAMW, "fused": True}, sgd))
    adv = _fired(run)["fused_optimizer"]
    assert "torch.optim.sgd.SGD" in adv.evidence and "AdamW" not in adv.evidence


# ------------------------------------------------------------------ a real captured script
SCRIPT = """
import torch
from torch import nn

torch.manual_seed(0)
# many small parameters: the per-parameter update loop is a large share of the step
model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(24)])
opt = torch.optim.AdamW(model.parameters(), lr=1e-3{kwargs})
x, y = torch.randn(2, 16), torch.randn(2, 16)
for _ in range(4):
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
"""


@pytest.mark.parametrize("kwargs", ["", ", fused=True", ", foreach=True"])
def test_a_real_script_run(kwargs: str, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(kwargs=kwargs))
    run, code = profile_script(["python", str(script)], tmp_path / "runs", steps=2, warmup=1)
    assert code == 0 and run.status == "complete"
    (record,) = run.manifest["optimizers"]
    assert (record["class"], record["differentiable"]) == ("AdamW", False)
    assert _share(run) >= OPTIMIZER_SHARE_MIN_PCT  # the phase is large enough in every variant
    fired = _fired(run)
    if kwargs:
        assert "fused_optimizer" not in fired, fired.get("fused_optimizer")
        return
    adv = fired["fused_optimizer"]
    assert "built without fused= or foreach=" in adv.evidence
    assert f"`profilednn optimize -- python {script}` (recipe fused_optimizer)" in adv.action
    assert "`torch.optim.AdamW(params, ..., fused=True)`" in adv.action and not check_action(adv.action)

"""Every advice action names a command that works for its Run: ``profilednn optimize --model
NAME`` with a built-in Run's own knobs, ``profilednn optimize -- <the script's command>`` for
a script Run, the ``profilednn.optimize(...)`` call for a Run of the Python API."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import click
import pytest
import typer
from runfactory import make_run
from test_advice import CASES

from profilednn import profile_builtin
from profilednn.analysis import RULES, Analysis, advise
from profilednn.analysis.next_steps import RULE_RECIPES, optimize_command
from profilednn.cli import app
from profilednn.recipe_catalogue import INJECTABLE, entry
from profilednn.workloads.zoo import get_spec, resolve_config

SCRIPT_ARGV = ("python", "train.py", "--lr", "0.1", "--out dir")
SCRIPT_COMMAND = "profilednn optimize -- python train.py --lr 0.1 '--out dir'"


def _parse_optimize(command: str) -> dict:
    """The optimize verb's parameters for ``command`` as the CLI parses them (no run); the
    workload knobs checked as ``build_workload`` checks them."""
    args = shlex.split(command)
    assert args[:2] == ["profilednn", "optimize"], command
    group = typer.main.get_command(app)
    verb = group.get_command(click.Context(group), "optimize")
    params = verb.make_context("optimize", args[2:]).params
    given = {k: v for k in ("batch_size", "image_size", "seq_len", "num_classes")
             if (v := params[k]) is not None}
    for item in params["knob"] or []:
        key, _, raw = item.partition("=")
        given[key] = json.loads(raw)
    resolve_config(get_spec(params["model"]), given, channels_last=params["channels_last"],
                   dtype=params["dtype"], seed=params["seed"])  # raises WorkloadError on a bad knob
    return params


def test_every_rule_is_mapped_to_the_recipe_that_acts_on_it() -> None:
    from profilednn.optimization.recipes import load_recipes

    by_recipes = {rule: name for name, recipe in load_recipes().items() for rule in recipe.advice_rules}
    assert RULE_RECIPES == by_recipes and set(RULE_RECIPES) == set(RULES)


def test_a_builtin_runs_command_parses_and_rebuilds_its_workload(tmp_path: Path) -> None:
    run = profile_builtin("small_cnn", tmp_path, steps=1, warmup=0, batch_size=2, image_size=16, seed=3,
                          channels_last=True, command=["profilednn", "profile", "--model", "small_cnn",
                                                       "--threads", "1", "--batch-size", "2"])
    command = optimize_command(run.manifest)
    assert command == ("profilednn optimize --model small_cnn --batch-size 2 --image-size 16 --num-classes 10 "
                       "--channels-last --seed 3 --threads 1")
    params = _parse_optimize(command)
    assert (params["batch_size"], params["image_size"], params["threads"], params["seed"]) == (2, 16, 1, 3)
    # knobs away from their defaults go through --set; the dtype can be overridden
    manifest = {"workload": {"kind": "builtin", "name": "bert_base",
                             "config": {**get_spec("bert_base").defaults, "batch_size": 1, "seq_len": 8,
                                        "layers": 2, "dtype": "bf16", "channels_last": False, "seed": 0}}}
    command = optimize_command(manifest)
    assert "--set layers=2" in command and "--dtype bf16" in command
    assert _parse_optimize(command)["knob"] == ["layers=2"]
    assert "--dtype" not in optimize_command(manifest, dtype="fp32")


def test_a_script_runs_command_is_its_own_command() -> None:
    manifest = {"workload": {"kind": "script", "name": "train.py", "argv": list(SCRIPT_ARGV)}}
    assert optimize_command(manifest) == SCRIPT_COMMAND
    assert optimize_command({"workload": {"kind": "api", "name": "Net"}}) is None
    assert optimize_command({"workload": {"kind": "builtin", "name": "not_built_in"}}) is None


@pytest.mark.parametrize("rule", sorted(CASES))
def test_each_action_names_the_runs_own_command(rule: str, tmp_path: Path) -> None:
    fire, _ = CASES[rule]
    recipe = RULE_RECIPES[rule]
    builtin = make_run(tmp_path / "builtin", **{**fire, "workload": "resnet50"})
    (adv,) = [a for a in advise(Analysis(builtin.path)) if a.rule == rule]
    command = optimize_command(builtin.manifest, dtype="fp32" if rule == "bf16_without_native_bf16" else None)
    assert f"`{command}`" in adv.action and f"recipe {recipe}" in adv.action
    _parse_optimize(command)
    script = make_run(tmp_path / "script", **{**fire, "script_argv": SCRIPT_ARGV})
    (adv,) = [a for a in advise(Analysis(script.path)) if a.rule == rule]
    # injected into the script, or (threads, allocator) set in its children's launch environment
    if recipe in INJECTABLE or entry(recipe).process_start:
        assert f"`{SCRIPT_COMMAND}`" in adv.action and adv.action.count("`profilednn optimize ") == 1  # named once
    else:  # optimize cannot reach the script with this recipe: the edit by hand, profiled again
        assert f"cannot inject recipe {recipe} into a script yet" in adv.action
        assert f"`profilednn profile -- {shlex.join(SCRIPT_ARGV)}`" in adv.action
        assert "`profilednn optimize -- " not in adv.action
    api = make_run(tmp_path / "api", **fire)  # tiny_resnet: not a built-in, as a Run of the API
    (adv,) = [a for a in advise(Analysis(api.path)) if a.rule == rule]
    assert f"`profilednn.optimize(model, optimizer, loss_fn, (inputs, targets), recipes='{recipe}')`" in adv.action


def test_commands_name_the_run_where_a_command_takes_one(tmp_path: Path) -> None:
    run = make_run(tmp_path, threads=1, native_conv=("layer1.0.conv1", "layer1.0.conv2"))
    (adv,) = [a for a in advise(Analysis(run.path)) if a.rule == "native_conv_fallback"]
    assert f"`profilednn project {run.path} --threads 2 --validate`" in adv.action
    bf16 = make_run(tmp_path / "bf16", native_bf16=True)
    (adv,) = [a for a in advise(Analysis(bf16.path)) if a.rule == "bf16_native"]
    assert f"`profilednn project {bf16.path}` measures it" in adv.evidence

"""Settings as data: each CLI option built from a settings dataclass takes its default and
help from the field (``option_fields.py``, ``cli/field_options.py``), so the two can never
drift apart: ``optimize`` from ``optimization.Settings``, ``train`` (and ``scale``'s
``--model``) from ``distributed.TrainConfig``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import typer
from typer.main import get_command
from typer.testing import CliRunner

from profilednn.cli.app import app
from profilednn.cli.field_options import FROM_FIELD, options_from
from profilednn.distributed.api import TrainConfig
from profilednn.option_fields import field_default, field_help, option
from profilednn.optimization.api import Settings

# verb -> its settings class and the CLI parameters that negate a field (flag -> field)
VERBS = {"optimize": (Settings, {}), "train": (TrainConfig, {"no_comm": "measure_comm"}),
         "scale": (TrainConfig, {})}
# options of these verbs that take a field's default (every TrainConfig field but the
# recorded command line is a `train` option)
EXPECTED = {
    # (--rounds, --warmup and --steps default to None: Settings' default for a built-in model,
    # ScriptSettings' for a script; test_optimize_help_names_both_defaults holds their help)
    "optimize": {"seed", "numerics_steps", "min_speedup", "child_runs", "headroom"},
    "train": {f.name for f in dataclasses.fields(TrainConfig)} - {"command"},
    "scale": {"model"},
}


def _params(verb: str) -> dict:
    command = get_command(app).commands[verb]
    return {p.name: p for p in command.params}


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_every_option_default_is_its_fields_default(verb):
    cls, negated = VERBS[verb]
    fields = {f.name for f in dataclasses.fields(cls)}
    seen = set()
    for name, param in _params(verb).items():
        field = negated.get(name, name)
        if field not in EXPECTED[verb]:
            continue
        assert field in fields
        want = field_default(cls, field)
        assert param.default == (not want if name in negated else want), (verb, name)
        seen.add(field)
    assert seen == EXPECTED[verb]


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_help_shows_each_fields_help(verb):
    cls, negated = VERBS[verb]
    params = _params(verb)
    result = CliRunner().invoke(app, [verb, "--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    shown = " ".join(result.output.replace("│", " ").split())
    checked = 0
    for name, param in params.items():
        field = negated.get(name, name)
        if field not in EXPECTED[verb] or field_help(cls, field) is None:
            continue  # a shared option (``--dtype``, ``-o``) says what it does for every verb
        assert param.help == field_help(cls, field)
        assert " ".join(field_help(cls, field).split()) in shown, (verb, name)
        checked += 1
    assert checked >= 1


def test_no_comm_turns_the_measurement_off():
    command = get_command(app).commands["train"]
    assert command.make_context("train", []).params["no_comm"] is False
    assert command.make_context("train", ["--no-comm"]).params["no_comm"] is True


@dataclasses.dataclass
class _Knobs:
    steps: int = option(4, help="Steps to take.")
    tag: str = option("x", flags=("--label",), help="What to call it.")
    on: bool = option(True, flags=("--off",), help="Turn it off.")
    names: list = option(default_factory=list, help="Names.")


def test_a_verb_built_from_fields_gets_their_values(tmp_path: Path):
    seen: dict = {}
    demo = typer.Typer()

    @demo.command()
    @options_from(_Knobs)
    def run(steps: int = FROM_FIELD, tag: str = FROM_FIELD, on: bool = FROM_FIELD) -> None:
        seen.update(steps=steps, tag=tag, on=on)

    runner = CliRunner()
    assert runner.invoke(demo, []).exit_code == 0
    assert seen == {"steps": 4, "tag": "x", "on": True}
    assert runner.invoke(demo, ["--steps", "2", "--label", "y", "--off"]).exit_code == 0
    assert seen == {"steps": 2, "tag": "y", "on": False}
    assert field_default(_Knobs, "names") == [] and field_default(_Knobs, "names") is not _Knobs().names


def test_a_parameter_without_a_field_fails_at_once():
    with pytest.raises(TypeError, match="no field 'nope'"):
        @options_from(_Knobs)
        def verb(nope: int = FROM_FIELD) -> None:
            pass


def test_optimize_help_names_both_defaults():
    """--rounds, --warmup and --steps have one default for a built-in model and another for a
    script: one Settings field each, whose help states both, and the numbers it states are
    the field's own (``option(..., script=...)``)."""
    from profilednn.option_fields import script_defaults

    params = _params("optimize")
    script = script_defaults(Settings)
    for option, name in (("rounds", "rounds"), ("warmup", "warmup"), ("child_steps", "child_steps")):
        assert params[option].default is None, option  # not given: the path's own default
        text = params[option].help
        assert f"(default {field_default(Settings, name)}; a script: {script[name]})" in text, (option, text)
        assert script[name] != field_default(Settings, name)
    assert Settings.for_script().child_steps == script["child_steps"] and Settings().child_steps == 3
    assert Settings.for_script(rounds=7).rounds == 7  # what is given wins over the script default
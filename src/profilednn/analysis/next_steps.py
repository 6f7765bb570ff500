"""The command that acts on an advice item, written for the Run the advice is about.

Advice leads somewhere only when its action names something the user can run as it
stands: for a built-in Run ``profilednn optimize --model NAME`` with that Run's knobs, for
a script Run ``profilednn optimize -- <the script's own command>``, for a Run of the
Python API the ``profilednn.optimize(...)`` call. ``optimize`` then tries the recipe that
acts on the rule (``RULE_RECIPES``: ``recipe_catalogue``'s advice rules of each recipe) beside
every other one, A/B-timed and numerics-checked. A script Run whose recipe ``optimize``
cannot inject into a script (not in ``recipe_catalogue.INJECTABLE``, read at each call)
is sent to the edit by hand, profiled again, or to the recipe on a built-in model or the
Python API instead. The rulebook appends this to every rule's action
(:func:`profilednn.analysis.rulebook.rule`).

Torch-free: a Run's manifest holds everything; only a built-in's knob defaults come
from the workload registry.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import recipe_catalogue

if TYPE_CHECKING:
    from .view import RunView

# advice rule -> the optimize recipe that acts on it (the catalogue's ``advice_rules``)
RULE_RECIPES: dict[str, str] = recipe_catalogue.RULE_RECIPES
# rules whose fix is to leave a dtype: optimize starts from fp32 and tries BF16 only where it pays
START_FROM_FP32 = frozenset({"bf16_without_native_bf16"})
SIZE_OPTIONS = (("batch_size", "--batch-size"), ("image_size", "--image-size"), ("seq_len", "--seq-len"),
                ("num_classes", "--num-classes"))
# profile options that carry over to optimize as they are (a value, or a flag)
CARRIED_OPTIONS = {"--threads": True, "--oversubscribe": False}
API_CALL = "profilednn.optimize(model, optimizer, loss_fn, (inputs, targets), recipes={recipe!r})"


def _workload(manifest: dict[str, Any]) -> dict[str, Any]:
    workload = manifest.get("workload")
    return workload if isinstance(workload, dict) else {}


def _knob_text(value: Any) -> str:
    """A ``--set`` value as the optimize verb parses it back (JSON where it can be)."""
    return value if isinstance(value, str) else json.dumps(value)


def _extra_knobs(name: str, config: dict[str, Any]) -> list[str]:
    """``--set KEY=VALUE`` for each registry knob (not a size option) the Run set away from
    its default; none when the registry cannot be read here (torch missing)."""
    try:
        from ..workloads.zoo import get_spec

        spec = get_spec(name)
    except ImportError:
        return []
    sized = {key for key, _ in SIZE_OPTIONS}
    out = []
    for knob in spec.knobs:
        if knob in sized or knob not in config or config[knob] == spec.defaults.get(knob):
            continue
        out += ["--set", f"{knob}={_knob_text(config[knob])}"]
    return out


def _carried(command: Any) -> list[str]:
    """The options of the Run's own command line that optimize takes the same way."""
    if not isinstance(command, list):
        return []
    out: list[str] = []
    args = [str(x) for x in command]
    for i, arg in enumerate(args):
        if arg == "--":
            break
        key, eq, value = arg.partition("=")
        if key not in CARRIED_OPTIONS:
            continue
        if not CARRIED_OPTIONS[key]:
            out.append(key)
        elif eq:
            out += [key, value]
        elif i + 1 < len(args):
            out += [key, args[i + 1]]
    return out


def optimize_command(manifest: dict[str, Any], *, dtype: str | None = None) -> str | None:
    """The ``profilednn optimize`` command line for this Run's workload, or None when none
    runs it (a Run of the Python API, a workload that is not built in).

    Built-in: ``--model NAME`` with the Run's batch/image/sequence/class sizes, its other
    knobs away from their defaults (``--set``), channels_last, dtype (``dtype`` overrides
    it), seed and the ``--threads``/``--oversubscribe`` of its command. Script:
    ``profilednn optimize -- <the command after profile's -->``.
    """
    from ..builtin_workloads import BUILTIN_WORKLOADS

    workload = _workload(manifest)
    kind, name = workload.get("kind"), str(workload.get("name") or "")
    if kind == "script":
        argv = workload.get("argv")
        if not isinstance(argv, list) or not argv:
            return None
        return "profilednn optimize -- " + shlex.join(str(a) for a in argv)
    if kind != "builtin" or name not in BUILTIN_WORKLOADS:
        return None
    config = workload.get("config") if isinstance(workload.get("config"), dict) else {}
    args = ["profilednn", "optimize", "--model", name]
    for key, option in SIZE_OPTIONS:
        if config.get(key) is not None:
            args += [option, str(config[key])]
    args += _extra_knobs(name, config)
    if config.get("channels_last"):
        args.append("--channels-last")
    chosen = dtype or config.get("dtype") or "fp32"
    if chosen != "fp32":
        args += ["--dtype", str(chosen)]
    if config.get("seed"):
        args += ["--seed", str(config["seed"])]
    args += _carried(manifest.get("command"))
    return shlex.join(args)


def by_hand(manifest: dict[str, Any], recipe: str) -> str:
    """For a script Run whose ``recipe`` optimize cannot reach (``recipe_catalogue.reaches_script``):
    edit, profile again, or measure the recipe where optimize can apply it."""
    argv = _workload(manifest).get("argv")
    again = (f"`profilednn profile -- {shlex.join(str(x) for x in argv)}`"
             if isinstance(argv, list) and argv else "profile it again")
    call = API_CALL.format(recipe=recipe)
    return (f"`profilednn optimize` cannot inject recipe {recipe} into a script yet: make the edit above in the "
            f"script by hand and profile it again ({again}) to A/B it yourself, or measure the recipe on a "
            f"built-in model (`profilednn optimize --model NAME --recipes {recipe}`) or through the Python API "
            f"(`{call}`).")


def run_argument(a: "RunView") -> str:
    """How a command names this Run: its path (quoted for the shell), or ``RUN`` for a log."""
    return "RUN" if a.is_log else shlex.quote(str(Path(a.path)))


def next_step(a: "RunView", rule: str, action: str = "", recipe: str | None = None) -> str | None:
    """The sentence that sends the user from advice ``rule`` to a command for this Run, or
    None when the rule has no recipe or ``action`` names the command already. ``recipe``:
    the recipe that acts on this instance of the rule, where not the rule's usual one."""
    recipe = recipe or RULE_RECIPES.get(rule)
    if recipe is None:
        return None
    if a.is_log:
        return ("`profilednn optimize` measures it on the workload, not on a log: profile it into a Run "
                "first (`profilednn profile --model NAME` or `profilednn profile -- python train.py ARGS`).")
    manifest = a.manifest
    fp32 = rule in START_FROM_FP32
    command = optimize_command(manifest, dtype="fp32" if fp32 else None)
    if command is None:
        call = API_CALL.format(recipe=recipe)
        return None if call in action else f"Try it, A/B-timed and numerics-checked: `{call}`."
    if _workload(manifest).get("kind") == "script" and not recipe_catalogue.reaches_script(recipe):
        return by_hand(manifest, recipe)
    if command in action:
        return None
    if fp32 and _workload(manifest).get("kind") == "script":
        return (f"Take the BF16 autocast or `.bfloat16()` out of the script, then `{command}` measures "
                f"the rest (recipe {recipe} tries BF16 only where it pays).")
    if fp32:
        return f"Start from fp32: `{command}` (recipe {recipe} tries BF16 only where it pays)."
    return f"Try it on this workload, A/B-timed and numerics-checked: `{command}` (recipe {recipe})."


__all__ = ["RULE_RECIPES", "by_hand", "next_step", "optimize_command", "run_argument"]

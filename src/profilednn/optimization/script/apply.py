"""``profilednn apply RUN -- python train.py ARGS``: the whole script, trained with what an
optimize Run of it accepted.

The script runs to its end in one child process (``arm.py`` without a window) under the
accepted launch environment (threads, allocator), with the accepted in-process recipes
injected as they were in the winning arm (BF16 autocast, fused optimizer, channels_last,
torch.compile, ...). Its arguments may differ from those optimize ran (more epochs, other
paths); its randomness is its own (no seeding). The script's output and exit code are the
command's.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from ...errors import InputError
from ...run import Run, load_run
from .runner import arm_command, child_env


def accepted_plan(run: Run) -> dict[str, Any]:
    """What ``run`` (an optimize Run of a script) accepted: injected recipes, environment,
    recipe options, code edits, how many ranks (on how many nodes) it launched and the ranks x
    threads layout it chose (None: the one it was given)."""
    script = run.manifest.get("script")
    if not isinstance(script, dict):
        kind = (run.manifest.get("workload") or {}).get("kind") or run.manifest.get("kind") or "unknown"
        raise InputError(f"{run.path} is not a Run of `profilednn optimize -- python ...` (its workload is "
                         f"{kind}); apply takes the Run that optimize wrote for a script")
    if run.status != "complete":
        raise InputError(f"{run.path} ended {run.status}: its recipes were not decided, nothing to apply")
    settings = (run.manifest.get("optimize") or {}).get("settings") or {}
    return {"recipes": list(script.get("recipes") or []), "environment": dict(script.get("environment") or {}),
            "options": dict(settings.get("options") or {}), "edits": list(script.get("edits") or []),
            "nproc_per_node": int(script.get("nproc_per_node") or 1), "nnodes": int(script.get("nnodes") or 1),
            "threads": settings.get("threads"), "layout": script.get("layout")}


def apply_spec(plan: dict[str, Any], argv: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The arm spec that trains ``argv``'s script to its end with ``plan``'s recipes, and its
    launch environment."""
    from ...capture.script_target import script_target

    script_target(argv)  # no script, or a missing file: one line, before anything runs
    spec = {"argv": list(argv), "recipes": plan["recipes"], "options": plan["options"], "seed": None,
            "window": False}
    return spec, dict(plan["environment"])


def apply_run(run: Run | Path | str, argv: list[str]) -> int:
    """Train ``argv``'s script to its end with ``run``'s accepted recipes and environment;
    the script's exit code."""
    run = run if isinstance(run, Run) else load_run(run)
    plan = accepted_plan(run)
    if plan["nproc_per_node"] > 1 or plan["nnodes"] > 1:
        raise InputError(f"{run.path} optimized the script on {plan['nproc_per_node']} ranks x {plan['nnodes']} "
                         "node(s): apply launches them through profilednn.distributed.apply_launched (the CLI does)")
    spec, env = apply_spec(plan, argv)
    with tempfile.TemporaryDirectory(prefix="profilednn-apply-") as tmp:
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        return subprocess.run(arm_command(spec_path), env=child_env(env), check=False).returncode


__all__ = ["accepted_plan", "apply_run", "apply_spec"]

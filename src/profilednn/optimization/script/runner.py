"""Start one arm of a script in a child process and read back what it measured.

Each arm is a fresh ``python -m profilednn.optimization.script`` process under the arm's
launch environment; its spec and result are JSON files in a temporary folder. The
script's own output goes where the caller says (``optimize`` sends it to stderr, so its
stdout keeps the report). How the arm ended decides what the caller hears: the window
measured (``ArmOutput``), or an ``ArmError`` that says in one line why not (the script
raised, exited, never stepped its optimizer, or the arm process died). The process runs
in a session of its own and is ended with its whole group (``..child_process``).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from ...capture.own_ranks import started_own_ranks
from ...errors import ProfileDNNError
from ..child_process import child_env, end_group, module_command, package_root, run_in_own_group


class ArmError(ProfileDNNError):
    """An arm did not measure its window; the message is the one-line reason."""


class NoOptimizerStep(ArmError):
    """The script ended without a single ``optimizer.step()``: there is no step to time."""


class StartedOwnRanks(ArmError):
    """The script started processes of its own for a bigger job than it was launched into."""


def own_ranks(facts: dict[str, Any]) -> str | None:
    """Why an arm cannot judge a script that started ranks of its own (None: it did not): its
    process group is bigger than the job it was started in (``WORLD_SIZE`` at its start; 1
    when none). Lightning's ``strategy="ddp"`` with ``devices=N`` does this without a
    launcher: it re-runs the script for its other ranks, which run without the arm's recipes,
    its observation or its window (a recipe that changes the gradient reduction, such as a
    BF16 allreduce hook, then breaks the job)."""
    world = facts.get("world_size")
    reason = started_own_ranks(world, facts.get("launched_world_size"))
    if reason is None:
        return None
    return (f"{reason}. optimize sees this process only: the other ranks would train without the recipes and "
            f"untimed. Launch every rank instead: give optimize --nproc-per-node {world} (profilednn optimize "
            f"--nproc-per-node {world} -- python train.py ...; under that launch Lightning reads torchrun's variables "
            "and starts no process of its own)")


@dataclass
class ArmOutput:
    """One arm's window: the loss of every step, the timed steps after the warm-up, what it
    saw of the script (``facts``) and what each injected recipe did (``applied``)."""

    losses: list[float]
    times_ms: list[float]
    first_step_ms: float | None
    facts: dict[str, Any] = field(default_factory=dict)
    applied: dict[str, str] = field(default_factory=dict)
    threads: int | None = None
    step_ms: list[float] = field(default_factory=list)  # every step, the warm-up's included
    faults_per_step: list[int] = field(default_factory=list)  # minor page faults of each timed step
    dropout_sites: list[dict[str, Any]] = field(default_factory=list)  # stream_gate.Site figures (option)
    headroom: dict[str, Any] | None = None  # the profiled steps by op family (spec "profile_steps")
    flops_by_dtype: dict[str, float] | None = None  # one step's model FLOPs (spec "count_flops_at")
    rank_losses: list[list[float]] = field(default_factory=list)  # --nproc-per-node: every rank's losses


def arm_command(spec_path: Path, result_path: Path | None = None) -> list[str]:
    """The arm's command line: ``python -m`` this package (``arm.main``) on the spec (and where to write its result)."""
    return module_command(__package__, str(spec_path), *([str(result_path)] if result_path else []))


def arm_output(result: dict[str, Any], window: int, at_least: int | None = None) -> ArmOutput:
    """What an arm's RESULT says: its window measured, or the ``ArmError`` that says why not."""
    status = result.get("status")
    done = int(result.get("steps_done") or 0)
    ended_cleanly = status == "ended" and not result.get("exit_code")
    if status == "window" or (ended_cleanly and at_least is not None and done >= at_least):
        spawned = own_ranks(result.get("facts") or {})
        if spawned:
            raise StartedOwnRanks(spawned)
        return ArmOutput(list(result["losses"]), list(result["times_ms"]), result.get("first_step_ms"),
                         dict(result.get("facts") or {}), dict(result.get("applied") or {}), result.get("threads"),
                         list(result.get("step_ms") or []), list(result.get("faults_per_step") or []),
                         list(result.get("dropout_sites") or []), result.get("headroom"),
                         result.get("flops_by_dtype"))
    if status == "error":
        raise ArmError(f"the script raised {result.get('error')} after {done} of {window} steps")
    if done == 0:
        how = f" ({result['error']})" if result.get("error") else ""
        raise NoOptimizerStep(
            f"the script ended{how} without calling optimizer.step(): optimize times and compares training "
            "steps, and a step ends at the optimizer's step()")
    how = result.get("error") or "ran to its end"
    raise ArmError(f"the script ended ({how}) after {done} of the {at_least or window} steps the window needs: "
                   "lower --warmup/--steps, or let the script train longer")


class ArmRunner(Protocol):
    """How an arm runs: one child process (``run_arm_process``) or, for a data-parallel
    script, a launch of every rank (``distributed.script_arms``)."""

    def __call__(self, spec: dict[str, Any], env: dict[str, str], *, timeout_s: float,
                 stdout: IO[str] | int | None = None, at_least: int | None = None,
                 stderr: IO[str] | int | None = None) -> ArmOutput: ...


@dataclass(frozen=True)
class ArmLayout:
    """Another way to run the same arm, which the search may choose at its end: a
    data-parallel script's ranks x threads at the user's global batch (``runner`` launches
    that layout; ``argv`` is the script's command line with its per-rank batch option set
    for it). ``record`` is what the Run keeps of it, for ``apply``."""

    label: str
    runner: ArmRunner
    argv: list[str]
    record: dict[str, Any]
    why_same: str  # why its losses are not compared step by step, and what keeps the training the same


def run_arm_process(spec: dict[str, Any], env: dict[str, str], *, timeout_s: float,
                    stdout: IO[str] | int | None = None, at_least: int | None = None,
                    stderr: IO[str] | int | None = None) -> ArmOutput:
    """Run one windowed arm of ``spec`` (``arm.py``'s spec) under ``env``; its output. With
    ``at_least``, a script that ends by itself after that many steps still counts (the
    caller learns how long the script trains). ``stdout``/``stderr``: where the script's
    output goes (default: this process's)."""
    window = int(spec["warmup"]) + int(spec["steps"])
    with tempfile.TemporaryDirectory(prefix="profilednn-arm-") as tmp:
        spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec_path.write_text(json.dumps({**spec, "window": True}))
        try:
            code = run_in_own_group(arm_command(spec_path, result_path), child_env(env), timeout_s,
                                    stdout=stdout, stderr=stderr)
        except subprocess.TimeoutExpired as exc:
            raise ArmError(f"the arm did not finish its {window} steps within {timeout_s:g} s") from exc
        if not result_path.exists():
            raise ArmError(f"the arm process died with exit code {code} before it measured its "
                           f"window (its output above says why)")
        result = json.loads(result_path.read_text())
    return arm_output(result, window, at_least)


__all__ = ["ArmError", "ArmLayout", "ArmOutput", "ArmRunner", "NoOptimizerStep", "StartedOwnRanks", "arm_command",
           "arm_output", "child_env", "end_group", "own_ranks", "package_root", "run_arm_process", "run_in_own_group"]

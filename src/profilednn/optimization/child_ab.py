"""The A/B in child processes: two arms, each a payload (``child.py`` rebuilds the setup
from it) and an environment, run A B B A ... in fresh processes, so a recipe that acts at
process start (allocator, threads) is measured where it acts."""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..capture.page_faults import page_bytes
from ..errors import ProfileDNNError, first_line
from ..progress import Progress
from ..train_step import TrainStep
from .abtest import ABResult, RunOutput, process_rounds
from .child_process import child_env, module_command, run_captured
from .recipes import Recipe
from .sequential import SequentialTest, fixed, round_line
from .settings import Settings

Arm = tuple[dict[str, Any], dict[str, str]]  # a child payload and its environment


class ChildSetupError(Exception):
    """The setup could not be written for a child process (the first line of why)."""



def child_payload(base: TrainStep, accepted: list[Recipe], settings: Settings,
                  numerics_steps: int | None = None) -> dict[str, Any]:
    """What a child process needs to rebuild ``base`` + ``accepted`` and time it: its numerics
    steps and warm-up together are at least ``settings.env_warmup`` steps, so a launch
    setting that acts on memory (huge pages, an allocator's caches) is timed once it settled."""
    numerics = numerics_steps or settings.numerics_steps
    payload: dict[str, Any] = {
        "recipes": list(accepted),
        "numerics_steps": numerics,
        "seed": settings.seed,
        "warmup": max(settings.warmup, settings.env_warmup - numerics),
        "steps": settings.child_steps,
        "threads": torch.get_num_threads(),
        "options": dict(settings.options),
    }
    rebuild = base.rebuild_args()
    if rebuild is not None:
        payload["workload"] = rebuild
    else:
        payload["setup"] = base
    return payload


def _run_child(payload_path: Path, env: dict[str, str], settings: Settings, label: str) -> dict[str, Any]:
    """One child process on ``payload_path`` under ``env`` (ended with its whole process group,
    a timeout's included); its result."""
    result_path = payload_path.with_name(f"result-{label}.pt")
    result_path.unlink(missing_ok=True)
    done = run_captured(module_command("profilednn.optimization.child", str(payload_path), str(result_path)),
                        child_env(env), settings.child_timeout_s)
    if done.code != 0 or not result_path.exists():
        raise ProfileDNNError(f"child process ({label}) exited with {done.code}: {done.tail()}")
    return torch.load(result_path, weights_only=False)


def children_ab(arm_a: Arm, arm_b: Arm, settings: Settings, say: Progress, label: str,
                test: SequentialTest | None = None) -> tuple[ABResult, dict[str, Any], dict[str, Any]]:
    """Arms A and B (each a child payload and its environment), one child process each a
    round, A B then B A ..., until ``test`` decides (default: ``settings.child_runs`` rounds);
    the A/B of their step times and each arm's first output (its seeded losses and
    gradients, with every run's page faults per step)."""
    test = test or fixed(settings.child_runs)
    with tempfile.TemporaryDirectory(prefix="profilednn-optimize-") as tmp:
        paths = {"a": Path(tmp) / "payload-a.pt", "b": Path(tmp) / "payload-b.pt"}
        try:
            torch.save(arm_a[0], paths["a"])
            torch.save(arm_b[0], paths["b"])
        except Exception as exc:
            raise ChildSetupError(first_line(exc)) from exc

        def runner(key: str, env: dict[str, str]) -> Callable[[int], RunOutput]:
            def run(r: int) -> RunOutput:
                say(f"{label}: child process {key.upper()} (round {r + 1})")
                out = _run_child(paths[key], env, settings, f"{key}{r}")
                return out["times_ms"], out.get("faults_per_step") or [], out
            return run

        rounds = process_rounds(runner("a", arm_a[1]), runner("b", arm_b[1]), test,
                                lambda done, found: say(round_line(label, done, test, found)))
    rounds.first_a["faults_per_step"], rounds.first_b["faults_per_step"] = rounds.faults_a, rounds.faults_b
    return rounds.ab, rounds.first_a, rounds.first_b


def faults_note(faults_a: Sequence[int], faults_b: Sequence[int]) -> str:
    """"minor page faults a step (median of the timed steps): A 85,012 (332 MiB), B 310 (1 MiB)"
    from each arm's timed steps; "" when an arm could not count them. What a launch setting
    that acts on memory changed."""
    counts = [list(faults_a), list(faults_b)]
    if not all(counts):
        return ""
    page = page_bytes()
    arms = [f"{arm} {statistics.median(c):,.0f} ({statistics.median(c) * page / 2**20:,.0f} MiB)"
            for arm, c in zip("AB", counts)]
    return "minor page faults a step (median of the timed steps): " + ", ".join(arms)


__all__ = ["ChildSetupError", "child_payload", "children_ab", "faults_note"]

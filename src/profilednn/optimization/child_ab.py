"""The A/B in child processes: two arms, each a payload (``child.py`` rebuilds the setup
from it) and an environment, run A B B A ... in fresh processes, so a recipe that acts at
process start (allocator, threads) is measured where it acts."""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..capture.page_faults import page_bytes
from ..errors import ProfileDNNError
from ..train_step import TrainStep
from .abtest import ABResult, Timing, from_samples
from .recipes import Recipe
from .settings import Settings

Progress = Callable[[str], None]
Arm = tuple[dict[str, Any], dict[str, str]]  # a child payload and its environment


class ChildSetupError(Exception):
    """The setup could not be written for a child process (the first line of why)."""


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message``: how a failure shows in a verdict or a note."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()


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
    result_path = payload_path.with_name(f"result-{label}.pt")
    result_path.unlink(missing_ok=True)
    proc = subprocess.run(
        [sys.executable, "-m", "profilednn.optimization.child", str(payload_path), str(result_path)],
        env=env, capture_output=True, text=True, timeout=settings.child_timeout_s,
    )
    if proc.returncode != 0 or not result_path.exists():
        tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-3:]
        raise ProfileDNNError(f"child process ({label}) exited with {proc.returncode}: {' | '.join(tail)}")
    return torch.load(result_path, weights_only=False)


def children_ab(arm_a: Arm, arm_b: Arm, settings: Settings, say: Progress,
                label: str) -> tuple[ABResult, dict[str, Any], dict[str, Any]]:
    """Arms A and B (each a child payload and its environment) in ``settings.child_runs``
    child processes each, run A B B A ...; the A/B of their step times and each arm's first
    output (its seeded losses and gradients)."""
    samples: dict[str, list[float]] = {"a": [], "b": []}
    faults: dict[str, list[int]] = {"a": [], "b": []}
    medians: dict[str, list[float]] = {"a": [], "b": []}
    first: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="profilednn-optimize-") as tmp:
        paths = {"a": Path(tmp) / "payload-a.pt", "b": Path(tmp) / "payload-b.pt"}
        envs = {"a": arm_a[1], "b": arm_b[1]}
        try:
            torch.save(arm_a[0], paths["a"])
            torch.save(arm_b[0], paths["b"])
        except Exception as exc:
            raise ChildSetupError(first_line(exc)) from exc
        order = [("a", "b") if i % 2 == 0 else ("b", "a") for i in range(settings.child_runs)]
        for i, pair in enumerate(order):
            for arm in pair:
                say(f"{label}: child process {arm.upper()} ({i + 1}/{settings.child_runs})")
                out = _run_child(paths[arm], envs[arm], settings, f"{arm}{i}")
                samples[arm] += list(out["times_ms"])
                faults[arm] += list(out.get("faults_per_step") or [])
                medians[arm].append(Timing(tuple(out["times_ms"])).median_ms)
                first.setdefault(arm, out)
    for arm in first:  # each arm's first output carries every child's fault counts
        first[arm]["faults_per_step"] = faults[arm]
    return from_samples(samples["a"], samples["b"], medians["a"], medians["b"]), first["a"], first["b"]


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


__all__ = ["ChildSetupError", "child_payload", "children_ab", "faults_note", "first_line"]

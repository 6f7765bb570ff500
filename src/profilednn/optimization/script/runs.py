"""The runs of a script's arms: each arm one child process (``runner.run_arm_process``) or a
launch of every rank, the A/B of two arms run in alternation, the noise floor at a
precision's resolution, the run with its random stream reseeded and the profiled run.
``search.ScriptSearch`` decides with them; this module only runs and pairs them.
"""

from __future__ import annotations

import math
import subprocess
from collections.abc import Callable
from dataclasses import replace
from typing import IO, Any

import polars as pl

from ...progress import Progress
from ..abtest import ABResult, RunOutput, Timing, process_rounds
from ..headroom import Headroom
from ..numerics import NumericsResult, Trajectory, compare_trajectories
from ..op_families import FAMILY_SCHEMA
from ..precision_gate import RESOLUTION, Calibration
from ..recipe_contract import Context, Tolerance
from ..sequential import SequentialTest, round_line
from ..settings import Settings
from .runner import ArmError, ArmLayout, ArmOutput, ArmRunner, run_arm_process



def median_step_ms(out: ArmOutput) -> float:
    """A run's median timed step (ms)."""
    return Timing(tuple(out.times_ms or out.step_ms)).median_ms


def loss_trajectory(out: ArmOutput, steps: int | None = None) -> Trajectory:
    """The arm's loss trajectory (its first ``steps`` losses: every gate judges one window).
    Under ``--nproc-per-node`` every rank's window, rank after rank: the gates compare step by
    step, so each rank's losses are held against the same rank's (numerics on every rank)."""
    ranks = out.rank_losses or [out.losses]
    return Trajectory([x for losses in ranks for x in losses[:steps]], {}, out.first_step_ms or 0.0)


def noise_of(reference: Trajectory, noisy: ArmOutput, steps: int) -> NumericsResult:
    """How far a noise arm's window (``noisy``) drifts from ``reference``: no tolerance, the figures only."""
    return compare_trajectories(reference, loss_trajectory(noisy, steps), Tolerance(math.inf, math.inf))


class ScriptRuns:
    """Runs a script's arms, each a child process, and pairs them: what :class:`ScriptSearch`
    measures and judges each recipe with."""

    def __init__(self, argv: list[str], settings: Settings, ctx: Context, say: Progress,
                 stdout: IO[str] | int | None = None, log: IO[str] | None = None,
                 runner: ArmRunner = run_arm_process) -> None:
        self.argv, self.settings, self.ctx, self.say, self.stdout = list(argv), settings, ctx, say, stdout
        self.runner = runner  # one child process per arm, or a launch of every rank (--nproc-per-node)
        self.log = log  # takes the script's stdout and stderr of every run, each after a header line
        self.runs = 0
        self.stock: ArmOutput | None = None
        self._last_a: tuple[tuple[Any, ...], ArmOutput] | None = None  # the last A/B's last run of arm A
        self.unpaired: list[ArmOutput] = []  # runs of the stock arm not yet in an A-vs-A pair
        self._calibrations: dict[str, Calibration] = {}
        self.gate = settings.gate(settings.window)  # the numerics gates judge the whole window's loss trajectory

    def arm(self, recipes: list[str], env: dict[str, str], label: str, perturb: float | None = None,
            warmup: int | None = None, at_least: int | None = None,
            options: dict[str, Any] | None = None, profile_steps: int = 0, count_flops_at: int = 0,
            layout: ArmLayout | None = None) -> ArmOutput:
        """One run of the script; ``options`` are added to the settings' recipe options. With
        ``profile_steps`` the steps after the warm-up are that many, under the profiler; with
        ``count_flops_at`` that step's model FLOPs are counted (``arm.FlopStep``); ``layout``:
        run it that way (its runner and command line) instead of the user's."""
        self.runs += 1
        warmup = self.settings.warmup if warmup is None else warmup
        steps = profile_steps + 1 if profile_steps else self.settings.child_steps  # + 1: the last region's close
        self.say(f"{label}: the script, {warmup + steps} steps (run {self.runs})")
        spec = {"argv": layout.argv if layout else self.argv, "recipes": list(recipes),
                "options": {**self.settings.options, **(options or {})},
                "seed": self.settings.seed, "warmup": warmup, "steps": steps, "profile_steps": profile_steps,
                "count_flops_at": count_flops_at, "perturb": perturb, "threads": self.settings.threads}
        stdout, stderr = self.stdout, None
        if self.log is not None:  # both streams into the log, after the run's header
            self.log.write(f"==> run {self.runs}: {label} ({warmup + steps} steps)"
                           + (f" under {' '.join(f'{k}={v}' for k, v in env.items())}" if env else "") + "\n")
            self.log.flush()
            stdout, stderr = self.log, subprocess.STDOUT
        runner = layout.runner if layout else self.runner
        return runner(spec, env, timeout_s=self.settings.child_timeout_s, stdout=stdout, stderr=stderr,
                      at_least=at_least)

    def ab(self, a: tuple[list[str], dict[str, str]], b: tuple[list[str], dict[str, str]],
           label: str, test: SequentialTest, warmup: int | None = None, b_options: dict[str, Any] | None = None,
           a_layout: ArmLayout | None = None, b_layout: ArmLayout | None = None
           ) -> tuple[ABResult, ArmOutput, ArmOutput]:
        """Arms A and B, one child process each a round, A B then B A ..., until ``test``
        decides; each after ``warmup`` untimed steps (default: the settings'); B's failure
        propagates. ``b_options``: more recipe options for B's runs. While arm A has not
        changed, its last run of the previous A/B is this one's first A (the runs are
        adjacent in time, so the pairing holds): one process less per recipe."""
        key = (tuple(a[0]), tuple(sorted(a[1].items())), warmup, a_layout.label if a_layout else None)
        kept, self._last_a = self._last_a, None

        def runner(arm: str, recipes: list[str], env: dict[str, str]) -> Callable[[int], RunOutput]:
            def run(r: int) -> RunOutput:
                if arm == "a" and r == 0 and kept is not None and kept[0] == key:
                    self.say(f"{label} A (round 1): the previous A/B's last run of the same arm")
                    out = kept[1]
                else:
                    out = self.arm(recipes, env, f"{label} {arm.upper()} (round {r + 1})", warmup=warmup,
                                   options=b_options if arm == "b" else None,
                                   layout=b_layout if arm == "b" else a_layout)
                if arm == "a":
                    self._last_a = (key, out)
                    if r == 0 and self.unpaired and not a[0] and not a[1] and a_layout is None:  # A is stock
                        first, second = (self.unpaired + [out])[:2]  # stock and rounding-noise run, or stock and A
                        test.noise.add([math.log(median_step_ms(first) / median_step_ms(second))])
                        self.unpaired = []
                return out.times_ms, out.faults_per_step, out
            return run

        rounds = process_rounds(runner("a", *a), runner("b", *b), test,
                                lambda done, found: self.say(round_line(label, done, test, found)))
        return (rounds.ab, replace(rounds.first_a, faults_per_step=rounds.faults_a),  # every run's faults
                replace(rounds.first_b, faults_per_step=rounds.faults_b))

    def calibration(self, precision: str) -> Calibration:
        """Stock's trajectory and its drift with weights perturbed at ``precision``'s resolution."""
        if precision not in self._calibrations:
            assert self.stock is not None
            reference = loss_trajectory(self.stock, self.settings.window)
            noisy = self.arm([], {}, f"noise floor at {precision} resolution", perturb=RESOLUTION[precision])
            self._calibrations[precision] = Calibration(precision, reference,
                                                        noise_of(reference, noisy, self.settings.window))
        return self._calibrations[precision]

    def headroom(self, recipes: list[str], env: dict[str, str], warmup: int, layout: ArmLayout | None = None
                 ) -> tuple[Headroom | None, dict[str, float] | None, str | None]:
        """One more run of the arm ``recipes`` + ``env`` (as ``layout``; default the user's):
        ``headroom_steps`` steps after ``warmup`` under torch.profiler, split by op family
        (``StepProfiler`` in the arm), then one step's model FLOPs by dtype (``FlopStep``).
        Returns (headroom, flops, None) or (None, None, why there is none)."""
        steps = self.settings.headroom_steps
        try:
            out = self.arm(recipes, env, f"headroom: {steps} steps under torch.profiler (time by op family)",
                           warmup=warmup, profile_steps=steps, layout=layout,
                           count_flops_at=warmup + steps + 1 if self.settings.measure_flops else 0)
        except ArmError as exc:
            return None, None, f"no headroom split: the profiled run failed ({exc})"
        if not out.headroom:
            return None, None, "no headroom split: the profiled run returned no profiled steps"
        split = out.headroom
        families = pl.DataFrame(split["families"], schema=FAMILY_SCHEMA)
        headroom = Headroom(families, int(split["steps"]), float(split["step_ms"]))
        headroom.notes += [
            f"ms per step under torch.profiler ({headroom.step_ms:.1f} ms a step there), mean of {headroom.steps} "
            "steps, each from its first module call to the next step's (its data loading, forward, backward and "
            "update); each event's self time counts once",
            "profiled in a child process of the script" + (" with the launch environment" if env else ""),
        ]
        return headroom, out.flops_by_dtype, None

    def reseeded(self, recipes: list[str], env: dict[str, str], label: str) -> ArmOutput:
        """The arm ``recipes`` under another random stream: torch reseeded at the model's first call."""
        return self.arm(recipes, env, f"{label}: random stream reseeded", options={"reseed": True})


__all__ = ["ScriptRuns", "loss_trajectory", "median_step_ms", "noise_of"]

"""The end of ``optimize``: all accepted recipes together, checked and timed once more.

Their numerics against the stock setup (judged at BF16's own resolution when a recipe
changes the number format), then the total: stock against optimized, interleaved; in
child processes when process-level recipes won, so the launch environment is included.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence

from ..errors import ProfileDNNError, first_line
from ..train_step import TrainStep
from .abtest import ABResult, interleaved
from .child_ab import ChildSetupError, child_payload, children_ab, faults_note
from .numerics import NumericsResult, calibrated, compare_trajectories, record_trajectory
from .precision_gate import precision_gate
from .recipes import Recipe
from .reference import Reference
from .search import Ending, SearchState
from .sequential import round_line
from .trial import Bench, build


FINAL_IN_CHILDREN = "final: stock vs optimized (with its launch environment), in child processes"


def final_numerics(bench: Bench, accepted: list[Recipe], reference: Reference) -> NumericsResult | None:
    """The accepted recipes together against stock (None when none was accepted)."""
    if not accepted:
        return None
    settings = bench.settings
    bench.say(f"final: numerics of all {len(accepted)} accepted recipes together")
    check = build(bench.base, accepted, bench.ctx)
    precise = [r.precision for r in accepted if r.precision]
    if precise:  # BF16 in the mix: judged by the precision gate at its own resolution
        calib = reference.calibration(precise[0])
        return precision_gate(accepted, calib, record_trajectory(check, len(calib.reference.losses), settings.seed),
                              bench.ctx, settings.gate())
    tolerance = calibrated(max((r.tolerance for r in accepted), key=lambda t: (t.loss_rtol, t.grad_rtol)),
                           reference.noise, settings.noise_factor)
    return compare_trajectories(
        reference.trajectory, record_trajectory(check, settings.numerics_steps, settings.seed), tolerance)


def take_final_in_children(end: Ending, ab: ABResult, stock_faults: Sequence[int],
                           optimized_faults: Sequence[int]) -> None:
    """The final A/B run in child processes (A stock, B optimized with its launch environment)
    into ``end``: its timings, where it ran and the page faults a launch setting changed. The
    built-in path's (``final_ab``) and a script's (``script.search``)."""
    end.baseline, end.final, end.interval = ab.before, ab.after, ab.interval
    faults = faults_note(stock_faults, optimized_faults)
    if faults:
        end.notes.append(f"final A/B, A stock and B optimized: {faults}")
    end.measured_in = (f"child processes (one per arm a round, {len(ab.pairs)} rounds, order alternating; launch "
                       "environment included)")


def _in_children(bench: Bench, state: SearchState, out: Ending) -> None:
    # the launch environment only acts at process start: stock and optimized each in
    # child processes (stock under this process's environment), so the total includes it
    settings, env = bench.settings, state.env
    bench.say(FINAL_IN_CHILDREN)
    try:
        ab, stock, optimized = children_ab((child_payload(bench.base, [], settings), dict(os.environ)),
                                           (child_payload(bench.base, state.accepted, settings),
                                            {**os.environ, **env}), settings, bench.say, "final",
                                           state.budget.test(settings.child_runs, final=True))
        take_final_in_children(out, ab, stock["faults_per_step"], optimized["faults_per_step"])
    except (ChildSetupError, ProfileDNNError, subprocess.TimeoutExpired) as exc:
        out.notes.append(f"the final A/B could not run in child processes ({first_line(exc)}); it ran in this "
                         "process, without the launch environment")


def final_ab(bench: Bench, state: SearchState, optimized: TrainStep, out: Ending) -> None:
    """Stock vs the ``optimized`` setup (warm: base + ``state.accepted``), for the total speedup:
    its timings, where they ran and what to note about it, into ``out``."""
    settings = bench.settings
    if not settings.final_ab:
        return
    if state.env:
        _in_children(bench, state, out)
    if out.final is None:
        bench.say("final: stock vs optimized, paired rounds")
        stock = bench.base.clone()
        test = state.budget.test(settings.rounds, final=True)
        ab = interleaved(stock.run, optimized.run, settings.rounds, settings.warmup + 1, test=test,
                         on_round=lambda done, found: bench.say(round_line("final", done, test, found)))
        out.baseline, out.final, out.interval = ab.before, ab.after, ab.interval
        out.measured_in = (f"this process, {len(ab.pairs)} paired rounds"
                           + (" (launch environment not included)" if state.env else ""))
        del stock


__all__ = ["FINAL_IN_CHILDREN", "final_ab", "final_numerics", "take_final_in_children"]

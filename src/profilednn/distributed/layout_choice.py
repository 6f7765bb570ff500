"""The ranks x threads layout as one of ``optimize --nproc-per-node``'s choices (seed 000,
Table 3: on a multi-core CPU the layout is often the biggest lever).

With ``--batch-arg FLAG`` (the script's per-rank batch option) the search ends by trying
every other layout of the same cores whose rank count divides the script's global batch
(its per-rank batch x ``--nproc-per-node``), each rank's batch set so that the global batch
stays the same: every step then optimises the same objective over as many samples, so what
the layout changes is speed, plus what any DDP job's layout changes (which samples each rank
sees, and BatchNorm's per-rank statistics). Without ``--batch-arg`` no layout is tried: a
layout that changed the global batch would change the training (``profilednn scale`` and
``convergence`` measure that trade).
"""

from __future__ import annotations

from typing import Any, Callable

from ..errors import InputError
from ..optimization.script.runner import ArmLayout, ArmRunner
from ..topology import cpu_topology
from .script_scale import batch_value, with_batch


def layout_label(ranks: int, threads: int) -> str:
    return f"{ranks} rank{'s' if ranks > 1 else ''} x {threads} thread{'s' if threads > 1 else ''}"


def other_layouts(argv: list[str], ranks: int, threads: int | None, batch_arg: str,
                  runner_of: Callable[[int, int], ArmRunner]) -> list[ArmLayout]:
    """Every other ranks x threads of the cores ``ranks`` x ``threads`` use (None: all
    physical cores) that keeps the script's global batch, each run by ``runner_of(ranks,
    threads)``; the user's own layout excluded."""
    per_rank = batch_value(argv, batch_arg)
    if per_rank is None:
        raise InputError(f"--batch-arg {batch_arg}: the script's arguments do not give it; add it to them (e.g. "
                         f"{batch_arg} 32) so that each layout can keep the global batch")
    cores = ranks * threads if threads else cpu_topology().physical_cores
    global_batch = per_rank * ranks
    out = []
    for r in range(1, cores + 1):
        if cores % r or global_batch % r or r == ranks:
            continue
        t = cores // r
        why = (f"the global batch kept ({global_batch} a step: {global_batch // r} on each of {r} rank(s) instead of "
               f"{per_rank} on each of {ranks}), so each step optimises the same objective; losses not compared step "
               "by step (each rank sees other samples; BatchNorm, if any, normalises over its rank's batch)")
        out.append(ArmLayout(layout_label(r, t), runner_of(r, t), with_batch(argv, batch_arg, global_batch // r),
                             {"ranks": r, "threads": t, "batch_arg": batch_arg, "launched_ranks": ranks,
                              "per_rank_batch": global_batch // r, "global_batch": global_batch}, why))
    return out


def launch_of(plan: dict[str, Any], argv: list[str]) -> tuple[int, int | None, list[str]]:
    """How ``apply`` launches ``argv``: the layout the optimize Run chose (each rank's batch set
    to keep the global batch of ``argv`` as given at the ranks optimize was launched with), else
    the ranks and threads it was given."""
    layout = plan.get("layout")
    if not layout:
        return int(plan["nproc_per_node"]), plan.get("threads"), list(argv)
    flag = str(layout["batch_arg"])
    given = batch_value(argv, flag)
    if given is None:
        raise InputError(f"the Run chose {layout_label(layout['ranks'], layout['threads'])} at the script's global "
                         f"batch: give the script's {flag} to apply as to optimize")
    global_batch = given * int(layout["launched_ranks"])
    if global_batch % int(layout["ranks"]):
        raise InputError(f"{flag} {given} on {layout['launched_ranks']} ranks is a global batch of {global_batch}, "
                         f"which {layout['ranks']} ranks cannot split evenly")
    return int(layout["ranks"]), int(layout["threads"]), with_batch(argv, flag, global_batch // int(layout["ranks"]))


__all__ = ["launch_of", "layout_label", "other_layouts"]

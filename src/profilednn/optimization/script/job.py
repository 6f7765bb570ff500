"""``optimize_script``: the one search over a user's script's arms, kept as a Run.

The Run holds what every optimize Run holds (``..outcome``) and, under
``manifest["script"]``, what ``apply`` needs: the argv, the injected recipes with what
each did, the launch environment, the code edits that do the same by hand.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import IO, Any

from ...errors import InputError
from ...progress import Progress
from ...run import Run, create_run
from ..engine import recipe_context
from ..estimates import fill_gains, profile_advice
from ..outcome import write_outcome
from ..partial import OnResults, ResultLog
from ..recipe_contract import Recipe
from ..recipes import select_recipes
from ..results import OptimizeReport
from ..search import run_search
from ..settings import Settings
from .checks import code_edits
from .runner import ArmError, ArmLayout, ArmRunner, run_arm_process
from .search import ScriptSearch


def search_script(argv: list[str], recipes: list[str | Recipe] | str | None, settings: Settings,
                  say: Progress, stdout: IO[str] | int | None = None,
                  on_results: OnResults | None = None, log: IO[str] | None = None,
                  runner: ArmRunner = run_arm_process, layouts: list[ArmLayout] | None = None
                  ) -> tuple[OptimizeReport, dict[str, Any]]:
    """The whole search on the script's arms (``search.py``); the report and the ``script``
    block of the Run's manifest (argv, injected recipes with what each did, environment,
    code edits). ``on_results`` hears the recipe results so far each time one is decided;
    ``layouts``: other ways to launch the arm, tried at the end (``ScriptSearch._choose_layout``)."""
    chosen = select_recipes(recipes)
    arms = ScriptSearch(argv, settings, recipe_context(chosen, settings), say, stdout, log, runner, layouts)
    arms.start(times_environment=any(r.fresh_process for r in chosen))
    report, state = run_search(" ".join(argv), chosen, arms, settings, on_results)
    edits = code_edits(state.names, arms.facts)
    if state.env:
        edits.append("launch with: " + report.launch_prefix() + " " + " ".join(argv))
    report.edits = edits
    script = {"argv": list(argv), "recipes": state.names, "applied": dict(state.applied),
              "environment": dict(state.env), "edits": edits, "facts": arms.facts.to_dict(), "runs": arms.runs,
              "nproc_per_node": settings.nproc_per_node, "nnodes": settings.nnodes,
              "layout": arms.chosen.record if arms.chosen else None}
    return report, script


def _open_log(path: Path) -> IO[str]:
    try:
        return path.open("a", encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot write the script log {path}: {exc.strerror or exc}") from None


def optimize_script(
    argv: list[str],
    runs_dir: Path | str = "runs",
    recipes: list[str | Recipe] | str | None = None,
    *,
    settings: Settings | None = None,
    progress: Progress | None = None,
    command: list[str] | None = None,
    profile: Path | str | None = None,
    stdout: IO[str] | int | None = None,
    script_log: Path | str | None = None,
    runner: ArmRunner | None = None,
    layouts: list[ArmLayout] | None = None,
) -> tuple[Run, OptimizeReport]:
    """Optimize the user's script ``argv`` (``python train.py ARGS`` or ``python -m pkg``)
    and keep the outcome as a Run (``optimize_recipes``, ``optimize_samples``, ``steps``,
    ``manifest["optimize"]`` with the code edits, ``manifest["script"]`` for ``apply``).
    ``settings``: default ``Settings.for_script()``; ``profile``: a profile Run of the same
    script whose advice gives each recipe's estimated gain. ``stdout``: where the script's
    output goes (default: stderr); ``script_log``: a file that takes the script's stdout and
    stderr of every run instead, each run headed by a ``==> run N: ...`` line (appended to,
    created if missing). ``runner``: how an arm runs (default: one child process); a
    data-parallel script's (``settings.nproc_per_node`` > 1) comes from
    ``profilednn.distributed.optimize_ddp_script``, which launches every rank, and so do its
    ``layouts`` (the other ranks x threads at the script's global batch)."""
    from ...capture.fingerprint import fingerprint
    from ...capture.script_target import script_target

    path, module, _ = script_target(argv)  # a missing script is a one-line error, before any Run
    settings = settings or Settings.for_script()
    settings.check_script()
    if runner is None:
        if settings.launched:
            raise InputError("--nproc-per-node or --nnodes > 1 launches every arm on several ranks: call "
                             "profilednn.distributed.optimize_ddp_script (the CLI does)")
        runner = run_arm_process
    advice = profile_advice(profile) if profile is not None else None
    say = progress or (lambda message: None)
    log = _open_log(Path(script_log)) if script_log is not None else None  # a bad path fails before any Run
    with contextlib.ExitStack() as stack:
        if log is not None:
            stack.callback(log.close)
        run = stack.enter_context(create_run(
            runs_dir, label=f"optimize-{path.stem if path else module}", command=command, fingerprint=fingerprint(),
            kind="optimize", workload={"kind": "script", "name": str(path or module), "argv": list(argv)}))
        try:
            report, script = search_script(argv, recipes, settings, say, sys.stderr if stdout is None else stdout,
                                           ResultLog(run, recipes), log, runner, layouts)
        except ArmError as exc:
            run.set_status("failed", error=str(exc))
            raise type(exc)(f"{exc} (Run kept as failed: {run.path})") from None
        fill_gains(report.recipes, advice)
        write_outcome(run, report, script=script)
    return run, report


__all__ = ["optimize_script", "search_script"]

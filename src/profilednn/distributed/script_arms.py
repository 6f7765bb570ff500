"""``optimize --nproc-per-node N -- python train.py``: every arm of the search a pinned launch
of the user's data-parallel script, and ``apply`` of such a Run launched the same way.

``LaunchedArms`` is the search's arm runner (``optimization.script.runner.ArmRunner``) for a
script that trains on several ranks: each arm is ``prepare_launch`` + ``run_launch`` of
``python -m profilednn.optimization.script SPEC RESULT.rank{rank}.json``, so every rank
runs the script with the arm's recipes injected and leaves at the end of the window. The
arm's timed step is, step by step, the slowest rank's (the ranks wait for each other at
every allreduce); its facts and what each recipe did are rank 0's; every rank's losses are
kept (``rank_losses``), and each numerics gate judges every rank's window against the same
rank's in the arm it compares with (``script.search._trajectory``); every rank's
parameters are compared bit for bit at the window's end (a digest), so a recipe that lets
the ranks drift apart is rejected like one that fails its numerics. A rank that raises,
dies or hangs ends the arm with that rank's own reason (``ArmError``: the recipe is
rejected and the search goes on; at the stock arm, the job stops).
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..errors import InputError
from ..optimization.script.runner import ArmError, ArmOutput, arm_output
from .control import ControlHost, hosting
from .launch import LaunchSettings, prepare_launch, run_launch
from .layout_choice import launch_of, other_layouts
from .node_settings import Nodes
from .script_scale import launch_arm, publish_or_discard, trained_alone
from .watchdog import JobFailed


class NotDataParallel(ArmError):
    """Under several ranks the script trained no model across them."""


@dataclass
class LaunchedArms:
    """Runs an arm as a launch of ``ranks`` ranks x ``threads`` threads (None: cores / ranks),
    on every node with ``host`` (node rank 0's control store; ``profilednn follow`` on the others)."""

    ranks: int
    threads: int | None = None
    runs: int = 0
    host: ControlHost | None = None

    def __call__(self, spec: dict[str, Any], env: dict[str, str], *, timeout_s: float,
                 stdout: IO[str] | int | None = None, at_least: int | None = None,
                 stderr: IO[str] | int | None = None) -> ArmOutput:
        self.runs += 1
        window = int(spec["warmup"]) + int(spec["steps"])
        with tempfile.TemporaryDirectory(prefix="profilednn-ddp-arm-") as tmp:
            job_dir = Path(tmp) / f"arm{self.runs}"
            try:
                results = launch_arm(job_dir, {**spec, "window": True, "param_digest": True}, self.ranks,
                                     self.threads, timeout_s, env, self.host)
            except JobFailed as exc:
                raise ArmError(str(exc)) from None
            finally:
                _relay(job_dir / "output.log", stdout)
        outputs = []
        for rank, result in enumerate(rank_results(results, len(results))):
            try:
                outputs.append(arm_output(result, window, at_least))
            except ArmError as exc:  # the same kind (NoOptimizerStep, ...), naming the rank
                raise type(exc)(f"rank {rank}: {exc}") from None
        return merged_output(outputs, results)


def _relay(log: Path, stdout: IO[str] | int | None) -> None:
    """The ranks' output (whole lines, tagged ``[rank<R>]:``) to where the search sends the script's."""
    if not log.exists() or not hasattr(stdout, "write"):
        return
    stdout.write(log.read_text(encoding="utf-8", errors="replace"))  # type: ignore[union-attr]
    stdout.flush()  # type: ignore[union-attr]


def rank_results(results: list[dict[str, Any] | None], ranks: int) -> list[dict[str, Any]]:
    """Every rank's result, or the ``ArmError`` of the first rank that wrote none."""
    missing = [rank for rank, r in enumerate(results) if r is None]
    if missing:
        raise ArmError(f"rank {missing[0]} of {ranks} wrote no result (its output above says why)")
    return [r for r in results if r is not None]


def merged_output(outputs: list[ArmOutput], results: list[dict[str, Any]]) -> ArmOutput:
    """One arm from its ranks: each step the slowest rank's, every rank's losses, the rest rank 0's; refused when
    the script trained no model across the ranks or the ranks ended out of sync."""
    ranks = len(outputs)
    alone = trained_alone(results)
    if alone:
        raise NotDataParallel(f"{alone}, or drop --nproc-per-node")
    digests = [r.get("param_digest") for r in results]
    if ranks > 1 and len(set(digests)) > 1:
        apart = next(rank for rank, d in enumerate(digests) if d != digests[0])
        raise ArmError(f"the ranks ended out of sync: rank {apart}'s parameters differ from rank 0's after the "
                       "window (a model not wrapped in DistributedDataParallel, or a recipe that broke the "
                       "gradient reduction)")
    first = outputs[0]
    slowest = [max(steps) for steps in zip(*(o.times_ms for o in outputs))]
    every = [max(steps) for steps in zip(*(o.step_ms for o in outputs))]
    first.times_ms, first.step_ms = slowest, every
    first.first_step_ms = max((o.first_step_ms or 0.0) for o in outputs) or first.first_step_ms
    first.rank_losses = [list(o.losses) for o in outputs] if ranks > 1 else []
    return first


def optimize_ddp_script(argv: list[str], runs_dir: Path | str = "runs", recipes: Any = None, *,
                        settings: Any = None, nodes: Nodes | None = None, **options: Any) -> tuple[Any, Any]:
    """``optimize_script`` with every arm launched on ``settings.nproc_per_node`` ranks
    (``settings.threads`` threads each; None: cores / ranks); with ``settings.batch_arg`` the
    other ranks x threads layouts at the script's global batch are tried at the end
    (``layout_choice``). With ``settings.nnodes`` > 1 this is node rank 0 and ``nodes`` says
    where its control store listens: every arm runs on every node (``profilednn follow``
    on the others)."""
    from ..optimization.script.job import optimize_script
    from ..optimization.settings import Settings

    settings = settings or Settings.for_script()
    if not settings.launched:
        raise InputError(f"optimize_ddp_script launches several ranks: nproc_per_node is {settings.nproc_per_node} "
                         "on one node")
    settings.check_script()
    nodes = checked_nodes(settings.nnodes, nodes, "optimize")
    with hosting(nodes) as host:  # the followers connected before any Run; told to exit however this ends
        runner = LaunchedArms(settings.nproc_per_node, settings.threads, host=host)
        layouts = (other_layouts(argv, settings.nproc_per_node, settings.threads, settings.batch_arg,
                                 lambda r, t: LaunchedArms(r, t, host=host)) if settings.batch_arg else None)
        return optimize_script(argv, runs_dir, recipes, settings=settings, runner=runner, layouts=layouts, **options)


def checked_nodes(nnodes: int, nodes: Nodes | None, verb: str) -> Nodes | None:
    """``nodes`` checked against the ``nnodes`` a job spans (None on one node)."""
    if nnodes <= 1 and (nodes is None or not nodes.several):
        return None
    nodes = nodes or Nodes(nnodes)
    if nodes.nnodes != nnodes:
        raise InputError(f"the job spans {nnodes} node(s), not the {nodes.nnodes} of its nodes' settings")
    nodes.check(verb)
    return nodes


def apply_launched(run: Any, argv: list[str], nodes: Nodes | None = None) -> int:
    """``apply`` of a data-parallel Run: the script trained to its end on the Run's ranks (or
    the layout it chose, each rank's batch set to keep the global batch) with the accepted
    recipes injected in each; the job's exit code (its ranks' output relayed). A Run
    optimized over several nodes needs ``nodes`` (as many): node rank 0 launches its part
    here, and each follower its own (``profilednn follow``); the first non-zero exit code
    of any node is the job's."""
    from ..optimization.script.apply import accepted_plan, apply_spec
    from ..optimization.script.runner import arm_command

    plan = accepted_plan(run)
    if plan["nnodes"] > 1 and (nodes is None or not nodes.several):
        raise InputError(f"{run.path} was optimized over {plan['nnodes']} nodes: give apply --nnodes "
                         f"{plan['nnodes']} --master-addr A [--master-port P] here (node rank 0) and run `profilednn "
                         "follow` with the same options on each other node")
    if nodes is not None and nodes.several and nodes.nnodes != plan["nnodes"]:
        raise InputError(f"{run.path} was optimized over {plan['nnodes']} node(s), not {nodes.nnodes}: apply it on as "
                         "many (other nodes would train another global batch)")
    nodes = checked_nodes(plan["nnodes"], nodes, "apply")
    ranks, threads, argv = launch_of(plan, argv)
    spec, env = apply_spec(plan, argv)
    with tempfile.TemporaryDirectory(prefix="profilednn-apply-") as tmp, hosting(nodes) as host:
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        settings = LaunchSettings(nproc_per_node=ranks, threads_per_rank=threads, runs_dir=Path(tmp),
                                  **(host.placement() if host else {}))
        prepared = prepare_launch(arm_command(spec_path), settings)
        prepared.env.update(env)
        if host:
            publish_or_discard(host, prepared, kind="apply", spec=spec, env=env, ranks=ranks, threads=threads,
                               timeout=settings.timeout)
        try:
            code = run_launch(prepared).exit_code
        except JobFailed as exc:
            print(f"profilednn apply: {exc}", file=sys.stderr)
            code = exc.exit_code or 1
        others = host.collect(None) if host else []
        for sent in others:
            if sent.get("failure"):
                print(f"profilednn apply: {sent['failure']}", file=sys.stderr)
        return code or next((int(s["exit_code"]) for s in others if s.get("exit_code")), 0)


__all__ = ["LaunchedArms", "NotDataParallel", "apply_launched", "checked_nodes", "merged_output",
           "optimize_ddp_script", "rank_results"]

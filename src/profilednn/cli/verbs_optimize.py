"""CLI verbs of the optimize job: ``optimize`` (a built-in model or ``-- python train.py``) and ``apply``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from ..distributed.api import Nodes, nodes_of
from ..formatting import finite, print_json
from ..optimization.api import Settings
from .field_options import FROM_FIELD, options_from
from .options import (
    BatchSize, ImageSize, MasterAddr, MasterPort, NNodes, NodeRank, NodeTimeout, NumClasses, OptionalModelName,
    Oversubscribe, RunsDir, SeqLen, Threads, Wide, check_dtype, command_line, size_knobs,
)
from .app import app, console, err_console, exit_interrupted


def _parse_sets(values: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` workload knobs; values parsed as JSON where they can be (3, 0.5, true)."""
    out: dict[str, Any] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"--set takes KEY=VALUE, got {item!r}")
        try:
            out[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.strip()] = raw
    return out


ProfileRun = Annotated[Optional[Path], typer.Option(
    "--profile", help="A profile Run of the same workload or script: its advice gives each recipe's estimated "
                      "gain, shown beside the measured one.")]


@app.command("optimize", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@options_from(Settings)
def optimize_cmd(
    ctx: typer.Context,
    model: OptionalModelName = None,
    batch_size: BatchSize = None,
    image_size: ImageSize = None,
    seq_len: SeqLen = None,
    num_classes: NumClasses = None,
    threads: Threads = None,
    oversubscribe: Oversubscribe = False,
    channels_last: Annotated[bool, typer.Option(
        "--channels-last", help="Start from channels_last memory format.")] = False,
    dtype: Annotated[str, typer.Option(help="Starting dtype: fp32 or bf16 (autocast; loss kept in fp32).")] = "fp32",
    seed: int = FROM_FIELD,
    recipes: Annotated[Optional[str], typer.Option(
        "--recipes", help="Comma-separated recipes to try (default: all).")] = None,
    rounds: int = FROM_FIELD,
    warmup: int = FROM_FIELD,
    child_steps: int = FROM_FIELD,
    numerics_steps: int = FROM_FIELD,
    min_speedup: float = FROM_FIELD,
    child_runs: int = FROM_FIELD,
    env_warmup: int = FROM_FIELD,
    time_budget_s: float = FROM_FIELD,
    noise_rounds: int = FROM_FIELD,
    nproc_per_node: int = FROM_FIELD,
    nnodes: int = FROM_FIELD,
    node_rank: NodeRank = 0,
    master_addr: MasterAddr = None,
    master_port: MasterPort = None,
    node_timeout: NodeTimeout = 300.0,
    batch_arg: Optional[str] = FROM_FIELD,
    compile_mode: Annotated[Optional[str], typer.Option(
        help="torch.compile mode for the torch_compile recipe.")] = None,
    knob: Annotated[Optional[list[str]], typer.Option(
        "--set", help="Workload knob KEY=VALUE (e.g. trainable_layers=3).")] = None,
    headroom: bool = FROM_FIELD,
    profile: ProfileRun = None,
    script_log: Annotated[Optional[Path], typer.Option(
        "--script-log", help="A script only: its stdout and stderr of every run go to this file (appended, each "
                             "run headed by a `==> run N` line) instead of the terminal.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    runs_dir: RunsDir = Path("runs"),
    wide: Wide = False,
) -> None:
    """Try each optimization recipe on a built-in workload or `-- python train.py ARGS`; keep
    what is faster and trains the same.

    Every recipe is A/B-timed against the current best in paired rounds, order alternating,
    until the speedup's interval decides (accepted above --min-speedup, rejected below it,
    inconclusive when --rounds or its share of --time-budget run out), and checked for
    numerics (seeded loss trajectory and gradients vs stock). A script is run several
    times, each a fresh process stopped after --warmup + --steps optimizer steps; it writes
    whatever it writes each time. Writes a Run with the `optimize_recipes` table;
    `profilednn report RUN` shows it, `profilednn apply RUN -- ...` trains with it. Over
    several nodes (--nnodes), run it on node rank 0 and `profilednn follow` on each other node.
    """
    script = list(ctx.args)
    given = {k: v for k, v in dict(
        seed=seed, rounds=rounds, warmup=warmup, child_steps=child_steps, numerics_steps=numerics_steps,
        min_speedup=min_speedup, child_runs=child_runs, env_warmup=env_warmup, headroom=headroom, threads=threads,
        time_budget_s=time_budget_s, noise_rounds=noise_rounds, nproc_per_node=nproc_per_node, batch_arg=batch_arg,
        nnodes=nnodes, options={"compile_mode": compile_mode} if compile_mode else {}).items() if v is not None}
    nodes = nodes_of(nnodes, node_rank, master_addr, master_port, node_timeout, "optimize")
    if script:
        _reject_model_options([("--model", model), ("--batch-size", batch_size), ("--image-size", image_size),
                               ("--seq-len", seq_len), ("--num-classes", num_classes), ("--set", knob),
                               ("--channels-last", channels_last), ("--dtype", dtype != "fp32")])
        _optimize_script(script, Settings.for_script(**given), recipes=recipes, profile=profile, as_json=as_json,
                         runs_dir=runs_dir, wide=wide, script_log=script_log, nodes=nodes)
        return
    _reject_script_options(model, script_log, nproc_per_node > 1 or nodes is not None, batch_arg)
    from ..optimization.api import select_recipes

    sizes = size_knobs(batch_size=batch_size, image_size=image_size, seq_len=seq_len, num_classes=num_classes)
    build_args = _model_args(sizes, knob, channels_last=channels_last, dtype=dtype, seed=seed)
    _optimize_model(model, build_args, Settings(**given), select_recipes(recipes) if recipes is not None else None,
                    profile=profile, as_json=as_json, runs_dir=runs_dir, wide=wide)


def _model_args(sizes: dict[str, Any], knob: Optional[list[str]], **start: Any) -> dict[str, Any]:
    """A built-in model's build arguments: its sizes, the ``--set`` knobs, then how it starts (dtype checked)."""
    check_dtype(start["dtype"])
    return {**sizes, **_parse_sets(knob or []), **start}


def _reject_script_options(model: Optional[str], script_log: Optional[Path], launched: bool,
                           batch_arg: Optional[str]) -> None:
    """A built-in model takes none of the script-only options, and needs a --model."""
    from ..errors import InputError

    if script_log is not None:
        raise InputError("--script-log applies to a script after `--`, not to a built-in model")
    if launched or batch_arg is not None:
        raise InputError("--nproc-per-node, --nnodes and --batch-arg apply to a data-parallel script after `--`; a "
                         "built-in model is optimized in one process (`profilednn scale --model` studies its ranks x "
                         "threads)")
    if not model:
        raise InputError("give --model NAME or a script after `--` (e.g. profilednn optimize -- python train.py)")


def _reject_model_options(options: list[tuple[str, Any]]) -> None:
    """A script after ``--`` takes none of the built-in models' options: say which were given."""
    from ..errors import InputError

    given = [name for name, value in options if value]
    if given:
        raise InputError(f"{', '.join(given)} apply to built-in models only, not to a script after `--`")


def _optimize_model(model: str, build_args: dict[str, Any], settings: Settings, chosen: Optional[list[Any]], *,
                    profile: Optional[Path], as_json: bool, runs_dir: Path, wide: bool) -> None:
    """``optimize --model NAME``: the search in-process under a status line, then the report."""
    from ..optimization.api import optimize_workload
    from ..optimization.terminal import print_recipes

    command = command_line()
    with err_console.status(f"optimizing {model}") as status:
        def progress(message: str) -> None:
            status.update(f"optimizing {model}: {message}")

        try:
            run, result = optimize_workload(model, runs_dir, chosen, settings=settings,
                                            progress=progress, command=command, profile=profile, **build_args)
        except KeyboardInterrupt as exc:
            exit_interrupted(exc)
    if as_json:
        print_json(finite({"run": str(run.path), **result.report.to_dict()}))
        return
    print_recipes(result.report, console, wide=wide)
    console.print(f"Run: {run.path}  ({run.status})", soft_wrap=True, highlight=False)


def _optimize_script(argv: list[str], settings: Settings, *, recipes: Optional[str], profile: Optional[Path],
                     as_json: bool, runs_dir: Path, wide: bool, script_log: Optional[Path],
                     nodes: Optional[Nodes] = None) -> None:
    """``optimize -- python train.py ARGS``: the script's output goes to stderr, the report to stdout."""
    from ..optimization.api import optimize_script
    from ..optimization.terminal import print_recipes

    settings.check_script()  # a bad option is one line, before the banner and before any Run
    name = " ".join(argv)
    ranks = settings.nproc_per_node
    how = (f"a pinned launch of {ranks} rank(s)" + (f" on each of {settings.nnodes} nodes" if nodes else "")
           if settings.launched else "a fresh process")
    err_console.print(f"optimizing `{name}`: the script is run several times, each {how} stopped after "
                      f"{settings.window} optimizer steps; whatever it writes, it writes each time"
                      + (f" (its output: {script_log})" if script_log else ""), highlight=False, soft_wrap=True)
    options: dict[str, Any] = {}
    optimize = optimize_script
    if settings.launched:
        from ..distributed.api import optimize_ddp_script as optimize

        options["nodes"] = nodes
    try:
        run, report = optimize(argv, runs_dir, recipes, settings=settings, command=command_line(),
                               profile=profile, script_log=script_log, **options,
                               progress=lambda message: err_console.print(f"  {message}", highlight=False))
    except KeyboardInterrupt as exc:
        exit_interrupted(exc)
    if as_json:
        print_json(finite({"run": str(run.path), **report.to_dict()}))
        return
    print_recipes(report, console, wide=wide)
    console.print(f"Run: {run.path}  ({run.status})", soft_wrap=True, highlight=False)
    chosen = ((run.manifest.get("script") or {}).get("layout") or {}) if settings.launched else {}
    how = (f" (launched as {chosen['ranks']} rank(s) x {chosen['threads']} thread(s), the layout optimize chose, "
           f"each rank's {chosen['batch_arg']} set to keep the global batch)" if chosen
           else f" (launched on {ranks} rank(s){' on each node' if nodes else ''}, as optimize ran it)"
           if settings.launched else "")
    where = (f" --nnodes {nodes.nnodes} --master-addr {nodes.master_addr} --master-port {nodes.port}"
             if nodes else "")
    console.print(f"train with it: profilednn apply {run.path}{where} -- {name}{how}"
                  + (" (and `profilednn follow` on each other node)" if nodes else ""), soft_wrap=True,
                  highlight=False)


@app.command("apply", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def apply_cmd(
    ctx: typer.Context,
    run: Annotated[Path, typer.Argument(help="The Run `profilednn optimize -- python ...` wrote.")],
    nnodes: NNodes = 1,
    node_rank: NodeRank = 0,
    master_addr: MasterAddr = None,
    master_port: MasterPort = None,
    node_timeout: NodeTimeout = 300.0,
) -> None:
    """Train `-- python train.py ARGS` to its end with the recipes and launch environment an
    optimize Run of it accepted (injected: the script is not edited). Exits with the script's code.
    A Run optimized over several nodes: the same --nnodes here (node rank 0, which launches its
    part) and `profilednn follow` on each other node, which launches its own.
    """
    from ..errors import InputError
    from ..optimization.api import accepted_plan, apply_run
    from ..run import load_run

    script = list(ctx.args)
    if not script:
        raise InputError("give the script after `--`, e.g. profilednn apply RUN -- python train.py")
    nodes = nodes_of(nnodes, node_rank, master_addr, master_port, node_timeout, "apply")
    loaded = load_run(run)
    plan = accepted_plan(loaded)
    err_console.print(f"applying {', '.join(plan['recipes']) or 'no in-process recipe'}"
                      + (f"; launch environment {' '.join(f'{k}={v}' for k, v in plan['environment'].items())}"
                         if plan["environment"] else ""), highlight=False, soft_wrap=True)
    launched = plan["nproc_per_node"] > 1 or plan["nnodes"] > 1 or nodes is not None  # its layout may be 1 rank
    try:
        if launched:
            from ..distributed.api import apply_launched  # every rank (every node's), as optimize launched it

            code = apply_launched(loaded, script, nodes)
        else:
            code = apply_run(loaded, script)
    except KeyboardInterrupt as exc:
        exit_interrupted(exc)
    if code:
        raise typer.Exit(code)

"""CLI verbs of the distributed job: launch, train, ranks, scale, convergence, project-nodes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from ..distributed.api import TrainConfig
from .field_options import FROM_FIELD, options_from
from .options import (
    ChannelsLast, Dtype, ImageSize, MasterAddr, MasterPort, NNodes, NodeRank, NodeTimeout, NumClasses, RunsDir, Seed,
    SeqLen, Wide, check_dtype, command_line, size_knobs,
)
from .app import app, console, err_console, exit_interrupted, styled
from .progress import progress_bar

if TYPE_CHECKING:
    from ..distributed.api import ScaleResult



@app.command("launch", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def launch_cmd(
    ctx: typer.Context,
    nproc_per_node: Annotated[int, typer.Option("--nproc-per-node", help="Ranks on this node.")],
    threads_per_rank: Annotated[Optional[int], typer.Option(
        "--threads-per-rank", help="OpenMP threads per rank (default: cores / ranks).")] = None,
    nnodes: Annotated[int, typer.Option("--nnodes", help="Number of nodes.")] = 1,
    node_rank: Annotated[int, typer.Option("--node-rank", help="This node's index (0 hosts the rendezvous).")] = 0,
    master_addr: Annotated[Optional[str], typer.Option("--master-addr", help="Address of node rank 0.")] = None,
    master_port: Annotated[Optional[int], typer.Option("--master-port", help="Rendezvous port on node rank 0.")] = None,
    allow_span: Annotated[bool, typer.Option("--allow-span", help="Allow a rank to span sockets.")] = False,
    backend: Annotated[str, typer.Option(
        help="auto (gloo), gloo, mpi or ccl; a missing one falls back to gloo.")] = "auto",
    max_restarts: Annotated[int, typer.Option(
        "--max-restarts", help="Restarts torchrun may do after a rank fails.")] = 0,
    timeout: Annotated[float, typer.Option(help="Watchdog: end the whole job after this many seconds.")] = 3600.0,
    rdzv_timeout: Annotated[float, typer.Option(
        "--rdzv-timeout", help="Seconds to wait for all nodes to join.")] = 120.0,
    pg_timeout: Annotated[float, typer.Option(
        "--pg-timeout", help="Seconds a collective may wait for a peer.")] = 300.0,
    job_id: Annotated[Optional[str], typer.Option(
        "--job-id", help="Job name and rendezvous id (same on every node).")] = None,
    ranks: Annotated[Optional[str], typer.Option(
        "--ranks",
        help="Show only these ranks' output, e.g. 0 or 0,1 (default: all; the log files keep every rank).")] = None,
    prefix: Annotated[bool, typer.Option(
        "--prefix/--no-prefix", help="Tag each rank's lines with [rank<R>]: .")] = True,
    runs_dir: Annotated[Optional[Path], typer.Option(
        "-o", "--runs-dir",
        help="Runs directory of the job; rank logs go to <runs-dir>/<job>/logs (default: the command's own -o for "
             "`profilednn train`, else runs).")] = None,
    allocator: Annotated[str, typer.Option(
        "--allocator", help="auto (tcmalloc, then jemalloc, when installed), tcmalloc, jemalloc or system.")] = "auto",
    membind: Annotated[bool, typer.Option(
        "--membind/--no-membind",
        help="Bind each rank's memory to its NUMA node with numactl (when installed).")] = True,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan and stop.")] = False,
) -> None:
    """Plan ranks x threads over this machine's sockets, pin them, and run `-- COMMAND` with torchrun."""
    from ..distributed.api import LaunchSettings, clean_exit_note, parse_ranks, prepare_launch, run_launch
    from ..distributed.terminal import print_plan

    shown = parse_ranks(ranks)
    settings = LaunchSettings(
        nproc_per_node=nproc_per_node, threads_per_rank=threads_per_rank, nnodes=nnodes,
        node_rank=node_rank, master_addr=master_addr, master_port=master_port, allow_span=allow_span,
        backend=backend, max_restarts=max_restarts, timeout=timeout, rdzv_timeout=rdzv_timeout,
        pg_timeout=pg_timeout, job_id=job_id, runs_dir=runs_dir, allocator=allocator, membind=membind,
    )
    prepared = prepare_launch(list(ctx.args), settings, check=not dry_run)
    try:  # the temporary plan directory goes however this ends (also --dry-run, a broken pipe)
        print_plan(prepared, console)
        if dry_run:
            return
        sys.stdout.flush()
        result = run_launch(prepared, ranks=shown, prefix=prefix)
    finally:
        prepared.discard()
    console.print(f"job {result.job_id} finished in {result.wall_s:.1f} s", highlight=False)
    note = clean_exit_note(result.exits)
    if note:
        console.print(note, highlight=False, soft_wrap=True)


@app.command("follow")
def follow_cmd(
    nnodes: NNodes,
    node_rank: NodeRank,
    master_addr: MasterAddr = None,
    master_port: MasterPort = None,
    node_timeout: NodeTimeout = 300.0,
) -> None:
    """Run this node's part of the jobs that `optimize`, `scale` or `apply` of a script with
    --nnodes starts on node rank 0: connect to its control store (--master-addr:--master-port),
    launch this node's ranks of each job it launches, send their results back; exit 0 when
    node 0 is done, 1 when it goes away first. Start it on every node but node rank 0."""
    from ..distributed.api import Nodes, follow

    try:
        code = follow(Nodes(nnodes, node_rank, master_addr, master_port, node_timeout),
                      say=lambda line: err_console.print(line, highlight=False, soft_wrap=True))
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: the job under way ended with its ranks
        exit_interrupted(exc)
    if code:
        raise typer.Exit(code)


@app.command("train")
@options_from(TrainConfig)
def train_cmd(
    model: str = FROM_FIELD,
    batch_size: Optional[int] = FROM_FIELD,
    global_batch: Optional[int] = FROM_FIELD,
    image_size: ImageSize = FROM_FIELD,
    seq_len: SeqLen = FROM_FIELD,
    num_classes: NumClasses = FROM_FIELD,
    channels_last: ChannelsLast = FROM_FIELD,
    dtype: Dtype = FROM_FIELD,
    seed: Seed = FROM_FIELD,
    lr: Optional[float] = FROM_FIELD,
    epochs: Optional[int] = FROM_FIELD,
    steps: Optional[int] = FROM_FIELD,
    warmup: int = FROM_FIELD,
    threads: Optional[int] = FROM_FIELD,
    checkpoint_dir: Optional[Path] = FROM_FIELD,
    checkpoint_every: int = FROM_FIELD,
    capture: bool = FROM_FIELD,
    capture_steps: int = FROM_FIELD,
    measure_comm: bool = FROM_FIELD,
    backend: Optional[str] = FROM_FIELD,
    pg_timeout: Optional[float] = FROM_FIELD,
    job_id: Optional[str] = FROM_FIELD,
    runs_dir: RunsDir = FROM_FIELD,
    wide: Wide = False,
) -> None:
    """Train a zoo model (or `digits`) with DDP; run it under `profilednn launch` for several ranks."""
    from ..distributed.api import train
    from ..tables import DIST_RANKS
    from ..distributed.terminal import print_ranks

    check_dtype(dtype)
    cfg = TrainConfig(model=model, batch_size=batch_size, global_batch=global_batch, image_size=image_size,
                      seq_len=seq_len, num_classes=num_classes, channels_last=channels_last, dtype=dtype,
                      seed=seed, lr=lr, steps=steps, epochs=epochs, warmup=warmup, threads=threads,
                      checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every, runs_dir=runs_dir,
                      job_id=job_id, capture=capture, capture_steps=capture_steps, measure_comm=measure_comm,
                      backend=backend, pg_timeout=pg_timeout, command=command_line(always=True))
    result = train(cfg)
    if result.rank != 0:
        return
    from ..run import load_run

    run = load_run(result.run.path)
    if run.has_table(DIST_RANKS):
        print_ranks(run.table(DIST_RANKS), f"{model}: {result.world_size} rank(s), global batch "
                                             f"{result.global_batch}", console, wide=wide)
    if result.start_step:
        console.print(f"resumed at step {result.start_step}", highlight=False)
    if result.items_per_s:
        console.print(f"throughput: {result.items_per_s:.1f} items/s · final loss {result.final_loss:.4f}",
                      highlight=False)
    console.print(f"Run: {run.path}", highlight=False, soft_wrap=True)


@app.command("ranks")
def ranks_cmd(
    job_dir: Annotated[Path, typer.Argument(help="A job directory runs/<job> written by `profilednn train`.")],
    threshold: Annotated[float, typer.Option(help="Straggler: compute this fraction above the median.")] = 0.10,
    wide: Wide = False,
) -> None:
    """The merged multi-rank view of a job: compute vs communication per rank, stragglers."""
    from ..distributed.api import merge_job
    from ..distributed.terminal import print_ranks

    view = merge_job(job_dir, threshold=threshold)
    print_ranks(view.per_rank, f"{job_dir}: {view.per_rank.height} rank(s)", console, wide=wide)
    if view.step_ms:
        console.print(f"job step time (slowest rank, median): {view.step_ms:.1f} ms", highlight=False)
    if view.stragglers:
        console.print(styled("stragglers:", "red", f" ranks {', '.join(map(str, view.stragglers))}"), highlight=False)


def _ints(text: Optional[str], name: str) -> Optional[list[int]]:
    if text is None:
        return None
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise typer.BadParameter(f"{name} takes comma-separated integers, e.g. 1,2,4") from None
    if not values or min(values) < 1:
        raise typer.BadParameter(f"{name} needs integers >= 1")
    return values


@app.command("scale", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@options_from(TrainConfig)
def scale_cmd(
    ctx: typer.Context,
    model: str = FROM_FIELD,
    cores: Annotated[Optional[int], typer.Option(help="Cores to use (default: all physical cores).")] = None,
    global_batch: Annotated[Optional[int], typer.Option(
        "--global-batch", help="Global batch (strong sweep); a script needs --batch-arg with it.")] = None,
    batch_arg: Annotated[Optional[str], typer.Option(
        "--batch-arg", help="A script's per-rank batch option (e.g. --batch-arg=--batch-size): each layout gets "
                            "global / ranks, so the global batch stays the script's (or --global-batch).")] = None,
    weak: Annotated[bool, typer.Option("--weak", help="Weak scaling: keep the local batch fixed.")] = False,
    batch_size: Annotated[Optional[int], typer.Option(help="Local batch for --weak (default: the model's).")] = None,
    ranks: Annotated[Optional[str], typer.Option(help="Rank counts to try, e.g. 1,2,4 (default: powers of 2).")] = None,
    threads: Annotated[Optional[str], typer.Option(
        help="Threads per rank to try, e.g. 1,2 (--weak: first one).")] = None,
    steps: Annotated[int, typer.Option(help="Steps per point.")] = 8,
    warmup: Annotated[int, typer.Option(help="Steps per point left out of the medians.")] = 2,
    image_size: ImageSize = None,
    seq_len: SeqLen = None,
    num_classes: NumClasses = None,
    channels_last: ChannelsLast = False,
    dtype: Dtype = "fp32",
    timeout: Annotated[float, typer.Option(help="Watchdog per point, seconds.")] = 1800.0,
    nnodes: NNodes = 1,
    node_rank: NodeRank = 0,
    master_addr: MasterAddr = None,
    master_port: MasterPort = None,
    node_timeout: NodeTimeout = 300.0,
    runs_dir: RunsDir = Path("runs"),
    wide: Wide = False,
) -> None:
    """Sweep ranks x threads at a fixed global batch (Table 3), or weak scaling with --weak, of a
    built-in model or of your data-parallel script (`profilednn scale -- python train.py ARGS`:
    every layout a real pinned launch of the unmodified script; --model does not apply; with
    --nnodes every layout runs on each node, `profilednn follow` running on the others)."""
    from ..distributed.api import nodes_of
    from ..distributed.terminal import print_scale
    from ..topology import cpu_topology

    nodes = nodes_of(nnodes, node_rank, master_addr, master_port, node_timeout, "scale")
    cores = cores or cpu_topology().physical_cores
    rank_list, thread_list = _ints(ranks, "--ranks"), _ints(threads, "--threads")
    study = dict(cores=cores, ranks=rank_list, steps=steps, warmup=warmup, runs_dir=runs_dir, timeout=timeout)
    with progress_bar() as bar:
        task = bar.add_task("scaling study", total=None)

        def progress(i: int, n: int, what: str) -> None:
            bar.update(task, completed=i, total=n, description=what)

        if ctx.args:
            source = ctx.get_parameter_source("model")
            given_model = source is not None and source.name == "COMMANDLINE"
            _no_model_options([("--model", given_model), ("--batch-size", batch_size), ("--image-size", image_size),
                               ("--seq-len", seq_len), ("--num-classes", num_classes),
                               ("--channels-last", channels_last), ("--dtype", dtype != "fp32")])
            result = _scale_script(list(ctx.args), {**study, "nodes": nodes}, weak, global_batch, batch_arg,
                                   thread_list, progress)
        else:
            if batch_arg is not None or nodes is not None:
                from ..errors import InputError

                raise InputError("--batch-arg and --nnodes apply to a script given after `--` (`scale --model` runs "
                                 "on this node; over nodes: `profilednn launch --nnodes N ... -- profilednn train`)")
            knobs = size_knobs(image_size=image_size, seq_len=seq_len, num_classes=num_classes,
                               channels_last=channels_last or None, dtype=dtype if dtype != "fp32" else None)
            check_dtype(dtype)
            result = _scale_model(model, study, weak, global_batch, batch_size, thread_list,
                                  knobs, progress)
    print_scale(result, console, wide=wide)


def _no_model_options(options: list[tuple[str, object]]) -> None:
    from ..errors import InputError

    given = [name for name, value in options if value]
    if given:
        verb = "applies" if len(given) == 1 else "apply"
        raise InputError(f"{', '.join(given)} {verb} to built-in models only, not to a script after `--`")


def _scale_script(argv: list[str], study: dict, weak: bool, global_batch: Optional[int], batch_arg: Optional[str],
                  thread_list: Optional[list[int]], progress) -> "ScaleResult":  # noqa: ANN001
    """``scale -- python train.py``: every layout a launch of the user's script."""
    from ..distributed.api import scale_script, weak_script

    if weak:
        if global_batch is not None or batch_arg is not None:
            from ..errors import InputError

            raise InputError("--weak keeps the script's own per-rank batch: drop --global-batch and "
                                     "--batch-arg")
        return weak_script(argv, threads_per_rank=(thread_list or [1])[0], progress=progress, **study)
    return scale_script(argv, global_batch=global_batch, batch_arg=batch_arg, threads=thread_list,
                        progress=progress, **study)


def _scale_model(model: str, study: dict, weak: bool, global_batch: Optional[int], batch_size: Optional[int],
                 thread_list: Optional[list[int]], knobs: dict, progress) -> "ScaleResult":  # noqa: ANN001
    """``scale --model NAME``: every layout a launch of the built-in DDP trainer."""
    from ..distributed.api import scale_sweep, weak_scaling

    if weak:
        if global_batch is not None:
            raise typer.BadParameter("--weak keeps the local batch fixed: give --batch-size, not --global-batch")
        if batch_size is None:
            from ..distributed.api import resolve_batches

            batch_size = resolve_batches(TrainConfig(model=model), 1)[0]
        return weak_scaling(model, local_batch=batch_size, threads_per_rank=(thread_list or [1])[0],
                            progress=progress, **study, **knobs)
    return scale_sweep(model, global_batch=global_batch, threads=thread_list, progress=progress, **study, **knobs)


@app.command("convergence")
def convergence_cmd(
    global_batches: Annotated[str, typer.Option(
        "--global-batches", help="Global batches to train at.")] = "16,32,64,128,256,512",
    target: Annotated[float, typer.Option(help="Target test accuracy.")] = 0.95,
    max_epochs: Annotated[int, typer.Option("--max-epochs", help="Give up after this many epochs.")] = 60,
    lr: Annotated[float, typer.Option(help="Learning rate at --base-batch.")] = 0.05,
    base_batch: Annotated[int, typer.Option("--base-batch", help="Global batch --lr is meant for.")] = 32,
    lr_scaling: Annotated[str, typer.Option("--lr-scaling", help="none, sqrt or linear in the global batch.")] = "sqrt",
    seeds: Annotated[str, typer.Option(help="Seeds (median epochs over them).")] = "0,1,2",
    ranks: Annotated[Optional[str], typer.Option(help="Rank counts to advise a local batch for, e.g. 2,8.")] = None,
    runs_dir: RunsDir = Path("runs"),
) -> None:
    """Epochs to a target accuracy vs global batch on scikit-learn's digits (Fig 7), with advice."""
    from ..distributed.api import convergence_study
    from ..distributed.terminal import print_convergence

    batches = _ints(global_batches, "--global-batches")
    seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    with progress_bar() as bar:
        task = bar.add_task("convergence", total=None)
        result = convergence_study(batches, target=target, max_epochs=max_epochs, lr=lr, base_batch=base_batch,
                                   lr_scaling=lr_scaling, seeds=seed_list, ranks=_ints(ranks, "--ranks"),
                                   runs_dir=runs_dir,
                                   progress=lambda i, n, what: bar.update(task, completed=i, total=n, description=what))
    print_convergence(result, target, lr_scaling, console)


@app.command("project-nodes")
def project_nodes_cmd(
    run: Annotated[Path, typer.Argument(help="Rank-0 Run of `profilednn train` (>= 2 ranks), or its job directory.")],
    max_nodes: Annotated[int, typer.Option("--max-nodes", help="Project up to this many nodes.")] = 64,
    ranks_per_node: Annotated[Optional[int], typer.Option(
        "--ranks-per-node", help="Default: the job's rank count.")] = None,
    alpha_us: Annotated[Optional[float], typer.Option("--alpha-us", help="Network latency per message (µs).")] = None,
    bandwidth_gbps: Annotated[Optional[float], typer.Option(
        "--bandwidth-gbps", help="Network bandwidth (GB/s).")] = None,
    overlap: Annotated[Optional[float], typer.Option(
        help="Fraction of the allreduce hidden under backward (default: measured).")] = None,
    wide: Wide = False,
) -> None:
    """Predict throughput and scaling efficiency on 1..64 nodes from a measured job (alpha-beta)."""
    from ..distributed.api import AlphaBeta, project_nodes
    from ..distributed.terminal import print_node_projection

    ab = None
    if (alpha_us is None) != (bandwidth_gbps is None):
        raise typer.BadParameter("give both --alpha-us and --bandwidth-gbps, or neither (use the measured ones)")
    if alpha_us is not None and bandwidth_gbps is not None:
        if alpha_us < 0 or bandwidth_gbps <= 0:
            raise typer.BadParameter("--alpha-us must be >= 0 and --bandwidth-gbps > 0")
        ab = AlphaBeta(alpha_us * 1e-6, 1.0 / (bandwidth_gbps * 1e9), 0, "given")
    table_df, notes, source = project_nodes(run, max_nodes=max_nodes, alpha_beta=ab, ranks_per_node=ranks_per_node,
                                            overlap=overlap)
    print_node_projection(table_df, notes, source.path, console, wide=wide)

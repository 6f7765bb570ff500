"""CLI verbs of the distributed job: launch, train, ranks, scale, convergence, project-nodes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from .options import (
    ChannelsLast, Dtype, ImageSize, NumClasses, RunsDir, Seed, SeqLen, check_dtype, size_knobs,
)
from .app import app, console, err_console, styled

Model = Annotated[str, typer.Option("--model", "-m", help="Built-in workload (see `profilednn models`) or `digits`.")]
BatchSize = Annotated[Optional[int], typer.Option(help="Batch size per rank (local batch).")]


def _command() -> list[str]:
    return ["profilednn", *sys.argv[1:]]


def print_plan(prepared) -> None:
    """The ranks x threads plan, the backend and the launcher command."""
    plan = prepared.plan
    table = Table(title=(f"plan: {plan.nproc_per_node} ranks x {plan.threads_per_rank} threads on node "
                         f"{plan.node_rank} of {plan.nnodes} ({plan.physical_cores} cores, {plan.sockets} "
                         f"socket(s), {plan.numa_nodes} NUMA node(s)); world size {plan.world_size}"),
                  title_justify="left")
    for col in ("local rank", "socket", "NUMA node", "cpus (pinned)", "threads", "memory"):
        table.add_column(col, justify="left")
    for slot in plan.ranks:
        table.add_row(str(slot.local_rank), ",".join(map(str, slot.sockets)), ",".join(map(str, slot.numa_nodes)),
                      _ranges(slot.cpus), str(plan.threads_per_rank), prepared.runtime.memory(slot.local_rank))
    console.print(table)
    console.print(f"backend: {prepared.backend.name} · master {prepared.master_addr}:{prepared.master_port} · "
                  f"job {prepared.job_id} · max restarts {prepared.max_restarts} · timeout {prepared.timeout:g} s",
                  highlight=False, soft_wrap=True)
    console.print(f"env per rank: OMP_NUM_THREADS={plan.threads_per_rank}, MKL_NUM_THREADS={plan.threads_per_rank}, "
                  "OMP_PLACES=<the rank's cpus>, OMP_PROC_BIND=close (yours kept, below), sched_setaffinity "
                  "before exec", highlight=False, soft_wrap=True)
    for line in prepared.runtime.settings:
        console.print(f"  {line}", highlight=False, soft_wrap=True)
    if prepared.log_dir is not None:
        console.print(f"output: whole lines tagged [rank<R>]: ; per-rank logs in {prepared.log_dir}",
                      highlight=False, soft_wrap=True)
    console.print(f"$ {prepared.torchrun_command()}", highlight=False, soft_wrap=True)
    for note in prepared.notes:
        console.print(styled("note:", "yellow", f" {note}"), highlight=False)


def _ranges(cpus) -> str:
    cpus = sorted(cpus)
    out, i = [], 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(out)


@app.command("launch", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def launch_cmd(
    ctx: typer.Context,
    nproc_per_node: Annotated[int, typer.Option("--nproc-per-node", help="Ranks on this node.")],
    threads_per_rank: Annotated[Optional[int], typer.Option("--threads-per-rank", help="OpenMP threads per rank (default: cores / ranks).")] = None,
    nnodes: Annotated[int, typer.Option("--nnodes", help="Number of nodes.")] = 1,
    node_rank: Annotated[int, typer.Option("--node-rank", help="This node's index (0 hosts the rendezvous).")] = 0,
    master_addr: Annotated[Optional[str], typer.Option("--master-addr", help="Address of node rank 0.")] = None,
    master_port: Annotated[Optional[int], typer.Option("--master-port", help="Rendezvous port on node rank 0.")] = None,
    allow_span: Annotated[bool, typer.Option("--allow-span", help="Allow a rank to span sockets.")] = False,
    backend: Annotated[str, typer.Option(help="auto (gloo), gloo, mpi or ccl; a missing one falls back to gloo.")] = "auto",
    max_restarts: Annotated[int, typer.Option("--max-restarts", help="Restarts torchrun may do after a rank fails.")] = 0,
    timeout: Annotated[float, typer.Option(help="Watchdog: end the whole job after this many seconds.")] = 3600.0,
    rdzv_timeout: Annotated[float, typer.Option("--rdzv-timeout", help="Seconds to wait for all nodes to join.")] = 120.0,
    pg_timeout: Annotated[float, typer.Option("--pg-timeout", help="Seconds a collective may wait for a peer.")] = 300.0,
    job_id: Annotated[Optional[str], typer.Option("--job-id", help="Job name and rendezvous id (same on every node).")] = None,
    ranks: Annotated[Optional[str], typer.Option("--ranks", help="Show only these ranks' output, e.g. 0 or 0,1 (default: all; the log files keep every rank).")] = None,
    prefix: Annotated[bool, typer.Option("--prefix/--no-prefix", help="Tag each rank's lines with [rank<R>]: .")] = True,
    runs_dir: Annotated[Optional[Path], typer.Option("-o", "--runs-dir", help="Runs directory of the job; rank logs go to <runs-dir>/<job>/logs (default: the command's own -o for `profilednn train`, else runs).")] = None,
    allocator: Annotated[str, typer.Option("--allocator", help="auto (tcmalloc, then jemalloc, when installed), tcmalloc, jemalloc or system.")] = "auto",
    membind: Annotated[bool, typer.Option("--membind/--no-membind", help="Bind each rank's memory to its NUMA node with numactl (when installed).")] = True,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan and stop.")] = False,
) -> None:
    """Plan ranks x threads over this machine's sockets, pin them, and run `-- COMMAND` with torchrun."""
    from ..distributed.launch import prepare_launch, run_launch
    from ..distributed.rank_output import parse_ranks

    shown = parse_ranks(ranks)
    prepared = prepare_launch(
        list(ctx.args), nproc_per_node=nproc_per_node, threads_per_rank=threads_per_rank, nnodes=nnodes,
        node_rank=node_rank, master_addr=master_addr, master_port=master_port, allow_span=allow_span,
        backend=backend, max_restarts=max_restarts, timeout=timeout, rdzv_timeout=rdzv_timeout,
        pg_timeout=pg_timeout, job_id=job_id, runs_dir=runs_dir, allocator=allocator, membind=membind,
        check=not dry_run,
    )
    try:  # the temporary plan directory goes however this ends (also --dry-run, a broken pipe)
        print_plan(prepared)
        if dry_run:
            return
        sys.stdout.flush()
        result = run_launch(prepared, ranks=shown, prefix=prefix)
    finally:
        prepared.discard()
    console.print(f"job {result.job_id} finished in {result.wall_s:.1f} s", highlight=False)


@app.command("train")
def train_cmd(
    model: Model = "small_cnn",
    batch_size: BatchSize = None,
    global_batch: Annotated[Optional[int], typer.Option("--global-batch", help="Global batch (split over the ranks).")] = None,
    image_size: ImageSize = None,
    seq_len: SeqLen = None,
    num_classes: NumClasses = None,
    channels_last: ChannelsLast = False,
    dtype: Dtype = "fp32",
    seed: Seed = 0,
    lr: Annotated[Optional[float], typer.Option(help="Learning rate (models that take one).")] = None,
    epochs: Annotated[Optional[int], typer.Option(help="Epochs (digits: passes over the data; others: over the synthetic pool).")] = None,
    steps: Annotated[Optional[int], typer.Option(help="Training steps.")] = None,
    warmup: Annotated[int, typer.Option(help="Steps left out of the timing medians.")] = 1,
    threads: Annotated[Optional[int], typer.Option(help="Intra-op threads (default: OMP_NUM_THREADS from launch).")] = None,
    checkpoint_dir: Annotated[Optional[Path], typer.Option("--checkpoint-dir", help="Checkpoint here; resume from the newest one.")] = None,
    checkpoint_every: Annotated[int, typer.Option("--checkpoint-every", help="Checkpoint every K steps.")] = 10,
    capture: Annotated[bool, typer.Option("--capture", help="Profile a few steps per rank (oneDNN verbose + torch.profiler).")] = False,
    capture_steps: Annotated[int, typer.Option("--capture-steps", help="Steps profiled with --capture.")] = 3,
    no_comm: Annotated[bool, typer.Option("--no-comm", help="Skip the allreduce alpha-beta measurement at the end.")] = False,
    backend: Annotated[Optional[str], typer.Option(help="Process-group backend (default: what launch chose, else gloo).")] = None,
    pg_timeout: Annotated[Optional[float], typer.Option("--pg-timeout", help="Seconds a collective may wait for a peer.")] = None,
    job_id: Annotated[Optional[str], typer.Option("--job-id", help="Job name (default: launch's job id).")] = None,
    runs_dir: RunsDir = Path("runs"),
) -> None:
    """Train a zoo model (or `digits`) with DDP; run it under `profilednn launch` for several ranks."""
    from ..distributed.trainer import TrainConfig, train

    check_dtype(dtype)
    cfg = TrainConfig(model=model, batch_size=batch_size, global_batch=global_batch, image_size=image_size,
                      seq_len=seq_len, num_classes=num_classes, channels_last=channels_last, dtype=dtype,
                      seed=seed, lr=lr, steps=steps, epochs=epochs, warmup=warmup, threads=threads,
                      checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every, runs_dir=runs_dir,
                      job_id=job_id, capture=capture, capture_steps=capture_steps, measure_comm=not no_comm,
                      backend=backend, pg_timeout=pg_timeout, command=_command())
    result = train(cfg)
    if result.rank != 0:
        return
    from ..run import load_run

    run = load_run(result.run.path)
    if run.has_table("dist_ranks"):
        print_ranks(run.table("dist_ranks"), title=f"{model}: {result.world_size} rank(s), global batch "
                                                      f"{result.global_batch}")
    if result.start_step:
        console.print(f"resumed at step {result.start_step}", highlight=False)
    if result.items_per_s:
        console.print(f"throughput: {result.items_per_s:.1f} items/s · final loss {result.final_loss:.4f}",
                      highlight=False)
    console.print(f"Run: {run.path}", highlight=False, soft_wrap=True)


def print_ranks(per_rank, title: str) -> None:
    """The merged per-rank table: step, compute, allreduce and exposed communication."""
    table = Table(title=title, title_justify="left",
                  caption="ms are medians per step; exposed = allreduce time not hidden under compute; "
                          "slowest = steps in which this rank computed longest", caption_justify="left")
    cols = [("rank", "rank", "{}"), ("step ms", "step_ms", "{:.1f}"), ("compute", "compute_ms", "{:.1f}"),
            ("allreduce", "allreduce_ms", "{:.1f}"), ("exposed", "exposed_comm_ms", "{:.1f}"),
            ("comm %", "comm_share", "{:.0%}"), ("vs median", "slowdown", "{:.2f}x"),
            ("slowest", "slowest_steps", "{}")]
    for head, _, _ in cols:
        table.add_column(head, justify="right")
    table.add_column("strag.")
    for row in per_rank.iter_rows(named=True):
        table.add_row(*[fmt.format(row[key]) if row.get(key) is not None else "" for _, key, fmt in cols],
                      styled("yes", "red") if row.get("straggler") else "")
    console.print(table)


@app.command("ranks")
def ranks_cmd(
    job_dir: Annotated[Path, typer.Argument(help="A job directory runs/<job> written by `profilednn train`.")],
    threshold: Annotated[float, typer.Option(help="Straggler: compute this fraction above the median.")] = 0.10,
) -> None:
    """The merged multi-rank view of a job: compute vs communication per rank, stragglers."""
    from ..distributed.merge import merge_job

    view = merge_job(job_dir, threshold=threshold)
    print_ranks(view.per_rank, title=f"{job_dir}: {view.per_rank.height} rank(s)")
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


def _study_progress():
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}", style="bold", markup=False), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=err_console, transient=True)


@app.command("scale")
def scale_cmd(
    model: Model = "small_cnn",
    cores: Annotated[Optional[int], typer.Option(help="Cores to use (default: all physical cores).")] = None,
    global_batch: Annotated[Optional[int], typer.Option("--global-batch", help="Global batch (strong sweep).")] = None,
    weak: Annotated[bool, typer.Option("--weak", help="Weak scaling: keep the local batch fixed.")] = False,
    batch_size: Annotated[Optional[int], typer.Option(help="Local batch for --weak (default: the model's).")] = None,
    ranks: Annotated[Optional[str], typer.Option(help="Rank counts to try, e.g. 1,2,4 (default: powers of 2).")] = None,
    threads: Annotated[Optional[str], typer.Option(help="Threads per rank to try, e.g. 1,2 (--weak: first one).")] = None,
    steps: Annotated[int, typer.Option(help="Steps per point.")] = 8,
    warmup: Annotated[int, typer.Option(help="Steps per point left out of the medians.")] = 2,
    image_size: ImageSize = None,
    seq_len: SeqLen = None,
    num_classes: NumClasses = None,
    channels_last: ChannelsLast = False,
    dtype: Dtype = "fp32",
    timeout: Annotated[float, typer.Option(help="Watchdog per point, seconds.")] = 1800.0,
    runs_dir: RunsDir = Path("runs"),
) -> None:
    """Sweep ranks x threads at a fixed global batch (Table 3), or weak scaling with --weak."""
    from ..distributed.scale import scale_sweep, weak_scaling
    from ..topology import cpu_topology

    cores = cores or cpu_topology().physical_cores
    knobs = size_knobs(image_size=image_size, seq_len=seq_len, num_classes=num_classes,
                       channels_last=channels_last or None, dtype=dtype if dtype != "fp32" else None)
    rank_list, thread_list = _ints(ranks, "--ranks"), _ints(threads, "--threads")
    with _study_progress() as bar:
        task = bar.add_task("scaling study", total=None)

        def progress(i: int, n: int, what: str) -> None:
            bar.update(task, completed=i, total=n, description=what)

        if weak:
            if global_batch is not None:
                raise typer.BadParameter("--weak keeps the local batch fixed: give --batch-size, not --global-batch")
            if batch_size is None:
                from ..distributed.trainer import TrainConfig, resolve_batches

                batch_size = resolve_batches(TrainConfig(model=model), 1)[0]
            result = weak_scaling(model, cores, batch_size, ranks=rank_list,
                                  threads_per_rank=(thread_list or [1])[0], steps=steps, warmup=warmup,
                                  runs_dir=runs_dir, timeout=timeout, progress=progress, **knobs)
        else:
            result = scale_sweep(model, cores, global_batch, ranks=rank_list, threads=thread_list, steps=steps,
                                 warmup=warmup, runs_dir=runs_dir, timeout=timeout, progress=progress, **knobs)
    _print_scale(result)


def _print_scale(result) -> None:
    t = result.table
    if t["mode"][0] == "strong":
        pivot = result.pivot()
        table = Table(title=f"normalized throughput, global batch {t['global_batch'][0]} (rows: threads per rank)",
                      title_justify="left")
        table.add_column("threads \\ ranks", justify="right")
        for col in pivot.columns[1:]:
            table.add_column(str(col), justify="right")
        for row in pivot.iter_rows():
            table.add_row(str(row[0]), *[f"{v:.2f}" if v is not None else "-" for v in row[1:]])
        console.print(table)
    detail = Table(title="per configuration", title_justify="left")
    for col in ("ranks", "threads", "local", "global", "step ms", "compute", "exposed comm", "items/s", "norm.",
                "eff."):
        detail.add_column(col, justify="right")
    for r in t.sort(["ranks", "threads"]).iter_rows(named=True):
        detail.add_row(str(r["ranks"]), str(r["threads"]), str(r["local_batch"]), str(r["global_batch"]),
                       f"{r['step_ms']:.1f}", f"{r['compute_ms']:.1f}", f"{r['exposed_comm_ms']:.1f}",
                       f"{r['items_per_s']:.1f}", f"{r['normalized']:.2f}", f"{r['efficiency']:.0%}")
    console.print(detail)
    for note in result.notes:
        console.print(styled("note:", "yellow", f" {note}"), highlight=False)
    console.print(f"chart: {result.run.path / 'scale.png'}", highlight=False, soft_wrap=True)
    console.print(f"Run: {result.run.path}", highlight=False, soft_wrap=True)


@app.command("convergence")
def convergence_cmd(
    global_batches: Annotated[str, typer.Option("--global-batches", help="Global batches to train at.")] = "16,32,64,128,256,512",
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
    from ..distributed.convergence import convergence_study

    batches = _ints(global_batches, "--global-batches")
    seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    with _study_progress() as bar:
        task = bar.add_task("convergence", total=None)
        result = convergence_study(batches, target=target, max_epochs=max_epochs, lr=lr, base_batch=base_batch,
                                   lr_scaling=lr_scaling, seeds=seed_list, ranks=_ints(ranks, "--ranks"),
                                   runs_dir=runs_dir,
                                   progress=lambda i, n, what: bar.update(task, completed=i, total=n, description=what))
    table = Table(title=f"epochs to {target:.0%} test accuracy on digits (lr scaling: {lr_scaling})",
                  title_justify="left")
    for col in ("global batch", "lr", "steps/epoch", "epochs", "steps", "ratio", "best acc"):
        table.add_column(col, justify="right")
    for r in result.table.iter_rows(named=True):
        reached = r["epochs_to_target"] is not None
        table.add_row(str(r["global_batch"]), f"{r['lr']:.3g}", str(r["steps_per_epoch"]),
                      str(r["epochs_to_target"]) if reached else "not reached",
                      str(r["steps_to_target"]) if reached else "-",
                      f"{r['convergence_ratio']:.2f}" if r["convergence_ratio"] is not None else "-",
                      f"{r['best_accuracy']:.3f}")
    console.print(table)
    for line in result.advice:
        console.print(styled("advice:", "cyan", f" {line}"), highlight=False)
    console.print(f"Run: {result.run.path}", highlight=False, soft_wrap=True)


@app.command("project-nodes")
def project_nodes_cmd(
    run: Annotated[Path, typer.Argument(help="Rank-0 Run of `profilednn train` (>= 2 ranks), or its job directory.")],
    max_nodes: Annotated[int, typer.Option("--max-nodes", help="Project up to this many nodes.")] = 64,
    ranks_per_node: Annotated[Optional[int], typer.Option("--ranks-per-node", help="Default: the job's rank count.")] = None,
    alpha_us: Annotated[Optional[float], typer.Option("--alpha-us", help="Network latency per message (µs).")] = None,
    bandwidth_gbps: Annotated[Optional[float], typer.Option("--bandwidth-gbps", help="Network bandwidth (GB/s).")] = None,
    overlap: Annotated[Optional[float], typer.Option(help="Fraction of the allreduce hidden under backward (default: measured).")] = None,
) -> None:
    """Predict throughput and scaling efficiency on 1..64 nodes from a measured job (alpha-beta)."""
    from ..distributed.comm import AlphaBeta
    from ..distributed.projection import ASSUMPTIONS, project_nodes

    ab = None
    if (alpha_us is None) != (bandwidth_gbps is None):
        raise typer.BadParameter("give both --alpha-us and --bandwidth-gbps, or neither (use the measured ones)")
    if alpha_us is not None and bandwidth_gbps is not None:
        if alpha_us < 0 or bandwidth_gbps <= 0:
            raise typer.BadParameter("--alpha-us must be >= 0 and --bandwidth-gbps > 0")
        ab = AlphaBeta(alpha_us * 1e-6, 1.0 / (bandwidth_gbps * 1e9), 0, "given")
    table_df, notes, source = project_nodes(run, max_nodes=max_nodes, alpha_beta=ab, ranks_per_node=ranks_per_node,
                                            overlap=overlap)
    table = Table(title=f"projection from {source.path.name}", title_justify="left")
    for col in ("nodes", "ranks", "global batch", "compute ms", "allreduce ms", "step ms", "items/s", "speedup",
                "efficiency"):
        table.add_column(col, justify="right")
    for r in table_df.iter_rows(named=True):
        table.add_row(str(r["nodes"]), str(r["ranks"]), str(r["global_batch"]), f"{r['compute_ms']:.1f}",
                      f"{r['allreduce_ms']:.2f}", f"{r['step_ms']:.1f}", f"{r['items_per_s']:.0f}",
                      f"{r['speedup']:.1f}x", f"{r['efficiency']:.0%}")
    console.print(table)
    for a in ASSUMPTIONS:
        console.print(f"assumes: {a}", highlight=False)
    for n in notes:
        console.print(styled("note:", "yellow", f" {n}"), highlight=False)
    console.print(f"written to {source.path} (table dist_projection)", highlight=False, soft_wrap=True)

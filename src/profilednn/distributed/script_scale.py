"""Scaling studies of the user's own data-parallel script: ``profilednn scale -- python train.py``.

Every layout (ranks x threads) is a real pinned launch of the unmodified script
(``prepare_launch`` + ``run_launch``), each rank running it as an arm of ``optimize``'s
script runner (``python -m profilednn.optimization.script``): the script's first optimizer
steps are its warm-up, the next ``steps`` are timed, ``comm_steps`` more run under
``torch.profiler`` for the compute vs allreduce split (``capture.comm_split``), and every
rank leaves at once with what it measured (``result.rank<R>.json`` in the layout's job
folder). A layout's step is its slowest rank's median step; its per-rank batch is the
leading size of the model's first input, as the script fed it.

Strong scaling (Table 3) keeps a global batch: with ``batch_arg`` (the script's own
per-rank batch option, e.g. ``--batch-size``) each layout gets ``global / ranks``; without
it the script keeps its own per-rank batch, so the global batch grows with the ranks, and
the notes say so with what that does to convergence. Weak scaling (``weak=True``) keeps the
per-rank batch and reports efficiency against one rank.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InputError, ProfileDNNError
from ..run import Run, create_run
from ..topology import cpu_topology
from .control import ControlHost, hosting
from .launch import LaunchSettings, PreparedLaunch, prepare_launch, run_launch
from .plan import rank_thread_grid
from .scale import ProgressFn, ScaleResult, finish_study, run_points
from .script_hints import alone_hint, launch_hint
from .watchdog import JobFailed

if TYPE_CHECKING:
    from .node_settings import Nodes

ARM_MODULE = "profilednn.optimization.script"
COMM_STEPS = 2  # profiled steps after the timed window of a multi-rank layout


class LayoutFailed(ProfileDNNError):
    """A layout's job did not measure its window: a rank raised, died, hung or never stepped."""


class NotDistributed(InputError):
    """Under several ranks the script never initialised a process group: each rank trained alone."""


@dataclass(frozen=True)
class ScriptJob:
    """What every layout of a study shares: the script's command line and the window."""

    argv: list[str]  # the script and its arguments (after ``python``)
    steps: int = 8
    warmup: int = 2
    timeout: float = 1800.0
    batch_arg: str | None = None  # the script's per-rank batch option, set per layout


# --------------------------------------------------------------------------- the script's batch option
def batch_value(argv: list[str], flag: str) -> int | None:
    """The integer the script's arguments give ``flag`` (``--batch-size 32`` or ``--batch-size=32``)."""
    for i, arg in enumerate(argv[1:], start=1):
        name, eq, value = arg.partition("=")
        if name != flag:
            continue
        value = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
        try:
            return int(value)
        except ValueError:
            raise InputError(f"--batch-arg {flag}: the script's arguments give it {value!r}, not an integer") from None
    return None


def with_batch(argv: list[str], flag: str, value: int) -> list[str]:
    """``argv`` with ``flag`` set to ``value`` (replaced where given, else appended)."""
    out, i = [argv[0]], 1
    found = False
    while i < len(argv):
        name, eq, _ = argv[i].partition("=")
        if name == flag and not found:
            found = True
            out += [f"{flag}={value}"] if eq else [flag, str(value)]
            i += 1 if eq else 2
            continue
        out.append(argv[i])
        i += 1
    return out if found else [*out, flag, str(value)]


# --------------------------------------------------------------------------- one layout
def launch_arm(job_dir: Path, spec: dict[str, Any], ranks: int, threads: int | None, timeout: float,
               env: dict[str, str] | None = None, host: ControlHost | None = None) -> list[dict[str, Any] | None]:
    """Every rank of ``ranks`` x ``threads`` runs the script as the arm ``spec`` (``env`` on top
    of the launch's); each rank's result (None: it wrote none). A failed job raises
    ``JobFailed`` with its reason replaced by the failing rank's own (``why_failed``). With
    ``host`` (several nodes) every follower launches its part of the same job and its ranks'
    results join node 0's, by global rank; a follower that does not answer in time fails the
    arm naming its node (``NodeMissing``)."""
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
    command = [sys.executable, "-m", ARM_MODULE, str(job_dir / "spec.json"), str(job_dir / "result.rank{rank}.json")]
    placement = host.placement() if host else {}
    settings = LaunchSettings(nproc_per_node=ranks, threads_per_rank=threads, timeout=timeout,
                              job_id=job_dir.name, runs_dir=job_dir.parent, **placement)
    prepared = prepare_launch(command, settings)  # a plan this node cannot run: nothing published yet
    prepared.env.update(env or {})
    if host:
        publish_or_discard(host, prepared, spec=spec, env=env or {}, ranks=ranks, threads=threads, timeout=timeout)
    failed: JobFailed | None = None
    try:
        run_launch(prepared, log_file=job_dir / "output.log")
    except JobFailed as exc:
        failed = exc
    sent = host.collect(job_dir) if host else []  # NodeMissing when a follower sends nothing in time
    world = ranks * (host.nnodes if host else 1)
    remote = [str(s["failure"]) for s in sent if s.get("failure")]  # a follower's own account ("node N: ...")
    if failed is None and not remote:
        return [read_result(job_dir, rank) for rank in range(world)]
    failures = failed.failures if failed is not None else []
    first = [int(f["rank"]) for f in failures if f.get("first") and str(f.get("rank", "")).isdigit()]
    reason = why_failed(job_dir, world, first) or (remote[0] if remote else None)
    if reason is None and failed is not None:
        raise failed
    raise JobFailed(str(reason), exit_code=failed.exit_code if failed is not None else 1, failures=failures)


def publish_or_discard(host: ControlHost, prepared: PreparedLaunch, **launch: Any) -> None:
    """``prepared``'s job published to the followers (``ControlHost.publish``); its plan
    folder removed when a follower does not take it up."""
    try:
        host.publish(launch.pop("kind", "arm"), prepared.job_id, prepared.master_port, **launch)
    except BaseException:
        prepared.discard()
        raise


def launch_layout(job: ScriptJob, argv: list[str], ranks: int, threads: int, job_dir: Path,
                  host: ControlHost | None = None) -> list[dict[str, Any]]:
    """Run the script on ``ranks`` x ``threads`` (on every node, with ``host``); every rank's result, by rank."""
    world = ranks * (host.nnodes if host else 1)
    spec = {"argv": argv, "warmup": job.warmup, "steps": job.steps, "window": True,
            "comm_steps": COMM_STEPS if world > 1 else 0}
    where = f"{ranks} rank(s) x {threads} thread(s)"
    output = f"(the script's output: {job_dir / 'output.log'})"
    try:
        results = launch_arm(job_dir, spec, ranks, threads, job.timeout, host=host)
    except JobFailed as exc:
        raise LayoutFailed(f"{where}: {exc} {output}") from exc
    missing = [rank for rank, r in enumerate(results) if r is None]
    if missing:
        raise LayoutFailed(f"{where}: rank {missing[0]} wrote no result {output}")
    return [r for r in results if r is not None]


def read_result(job_dir: Path, rank: int) -> dict[str, Any] | None:
    path = job_dir / f"result.rank{rank}.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


PEER_GONE = ("connection closed by peer", "connection reset by peer")  # a consequence of another rank's end


def why_failed(job_dir: Path, ranks: int, first: list[int] | None = None) -> str | None:
    """The failing rank's own reason, from its result: the script's error, or too few steps.
    A rank that only lost its peer comes last; then the launcher's first failure first."""
    results = {rank: read_result(job_dir, rank) for rank in range(ranks)}
    ended = [rank for rank, r in results.items() if r is not None and r.get("status") != "window"]

    def order(rank: int) -> tuple[bool, bool, int]:
        error = str(results[rank].get("error") or "").lower()  # type: ignore[union-attr]
        return any(words in error for words in PEER_GONE), rank not in (first or []), rank

    for rank in sorted(ended, key=order):
        result = results[rank]
        assert result is not None
        done = result.get("steps_done", 0)
        if result.get("error"):
            if result.get("traceback"):
                print(f"[rank{rank}]: {result['traceback'].rstrip()}", file=sys.stderr)
            hint = launch_hint(str(result["error"]))
            return (f"rank {rank}: the script raised {result['error']} after {done} optimizer step(s)"
                    + (f". {hint}" if hint else ""))
        return f"rank {rank}: the script ended after {done} optimizer step(s), before the window's end"
    return None


# --------------------------------------------------------------------------- a layout's row
def per_rank_batch(result: dict[str, Any]) -> int | None:
    """The leading size of the first root module's input, as the script fed it."""
    for root in (result.get("facts") or {}).get("roots") or []:
        if root.get("batch"):
            return int(root["batch"])
    return None


def comm_share(result: dict[str, Any], key: str) -> float:
    """A rank's ``key`` (allreduce or exposed ms) as a share of its profiled steps' length:
    the profiler slows a step, so the share, not the milliseconds, carries over to the
    steps timed without it."""
    comm = result.get("comm") or {}
    step = float(comm.get("step_ms") or 0.0)
    return min(1.0, float(comm.get(key) or 0.0) / step) if step > 0 else 0.0


def trained_alone(results: list[dict[str, Any]]) -> str | None:
    """Why the ranks of a launched arm did not train one model (None: they did, or one rank)."""
    facts = (results[0].get("facts") or {}) if results else {}
    if len(results) < 2 or facts.get("world_size"):
        return None
    return (f"under {len(results)} ranks the script never called torch.distributed.init_process_group: each "
            "rank trained alone on its own data, which is not data parallelism. "
            + (alone_hint(facts.get("frameworks") or [], len(results))
               or "Make the script initialise a process group when torchrun's variables are set (RANK, WORLD_SIZE, "
                  "MASTER_ADDR: init_method env://)"))


def layout_row(results: list[dict[str, Any]], ranks: int, threads: int, job_id: str,
               given_batch: int | None) -> dict[str, Any]:
    """One row of the ``scale`` table from every rank's result (``ranks`` on each node; the
    results of every node's ranks)."""
    world = len(results)
    alone = trained_alone(results)
    if alone:
        raise NotDistributed(f"{alone}, or scale it with --ranks 1")
    profiled = [r["comm"] for r in results if r.get("comm")]
    if world > 1 and profiled and not any(c.get("collectives") for c in profiled):
        raise NotDistributed(
            f"under {world} ranks the script initialised a process group but ran no collective in its profiled "
            "steps: its model is not wrapped in DistributedDataParallel (or it never reduces its gradients), so "
            "each rank trained a model of its own. Wrap the model in DistributedDataParallel on the CPU too, or "
            "scale it with --ranks 1")
    steps = [statistics.median(r["times_ms"]) for r in results]
    exposed = [comm_share(r, "exposed_ms") * step for r, step in zip(results, steps)]
    local = per_rank_batch(results[0]) or given_batch
    step_ms = max(steps)
    return {
        "ranks": ranks, "threads": threads, "cores_used": ranks * threads, "local_batch": local,
        "global_batch": local * world if local else None, "step_ms": step_ms,
        "compute_ms": max(s - e for s, e in zip(steps, exposed)),
        "allreduce_ms": statistics.median(comm_share(r, "allreduce_ms") * step for r, step in zip(results, steps)),
        "exposed_comm_ms": statistics.median(exposed),
        "items_per_s": local * world / (step_ms / 1000.0) if local and step_ms > 0 else None,
        "job_id": job_id, "rank0_run": None,
    }


def throughput(row: dict[str, Any]) -> float:
    """Items/s; without a known batch, rank-steps/s (the same per-rank batch in every layout)."""
    return row["items_per_s"] or row["ranks"] * 1000.0 / row["step_ms"]


def normalise(rows: list[dict[str, Any]], weak: bool) -> dict[str, Any]:
    """Throughput over the smallest layout's (Table 3's corner), and the efficiency that
    implies; the base row."""
    base = min(rows, key=lambda row: (row["ranks"] * row["threads"], row["ranks"]))
    for row in rows:
        row["normalized"] = throughput(row) / throughput(base)
        grown = row["ranks"] / base["ranks"] if weak else row["cores_used"] / base["cores_used"]
        row["efficiency"] = row["normalized"] / grown if row["normalized"] is not None else None
    return base


# --------------------------------------------------------------------------- what the rows mean
def batch_notes(rows: list[dict[str, Any]], reference: int | None, kept: bool) -> list[str]:
    """Which layouts trained another global batch than the user's, and what that means."""
    if reference is None:
        return ["the per-rank batch could not be read from the script's model call (no tensor argument): "
                "items/s are not computed and normalized throughput counts rank-steps/s"]
    if kept:
        return [f"every layout trained the global batch {reference} (--batch-arg sets each rank's share)"]
    other = sorted({row["global_batch"] for row in rows if row["global_batch"] not in (None, reference)})
    if not other:
        return []
    layouts = ", ".join(f"{row['ranks']}x{row['threads']}: {row['global_batch']}" for row in rows
                        if row["global_batch"] in other)
    return [f"global batch differs from the script's {reference} in one process ({layouts}): each rank keeps "
            "the script's per-rank batch, so the global batch grows with the ranks. A larger global batch "
            "takes fewer optimizer steps per epoch and usually more epochs to reach the same accuracy "
            "(seed 000, Fig 7; `profilednn convergence` measures it): raise the learning rate with it "
            "(sqrt or linear scaling) and check the accuracy, or keep the global batch with "
            "--batch-arg FLAG (the script's per-rank batch option)"]


def comm_note(rows: list[dict[str, Any]]) -> list[str]:
    multi = [row for row in rows if row["ranks"] > 1]
    if not multi:
        return []
    return [f"allreduce and exposed communication: their shares of {COMM_STEPS} steps after each timed window "
            "under torch.profiler (the backend's collectives vs the end of backward), applied to the timed "
            "step; compute = step - exposed"]


def nodes_note(nodes: Nodes | None) -> list[str]:
    if nodes is None:
        return []
    return [f"{nodes.nnodes} nodes: ranks and threads are each node's (the same on every node); the world size is "
            f"ranks x {nodes.nnodes}, and the global batch and items/s count every node's ranks"]


# --------------------------------------------------------------------------- the studies
def study_run(runs_dir: Path, mode: str, job: ScriptJob, config: dict[str, Any]) -> Run:
    """The study's Run, for ``with study_run(...) as run:`` (create_run's lifecycle)."""
    from ..capture.script_target import script_target

    path, module, _ = script_target(job.argv)
    name = str(path or module)
    workload = {"kind": "script", "name": name, "argv": list(job.argv)}
    return create_run(runs_dir, label=f"scale-{mode}", command=["profilednn", "scale", "--", *job.argv],
                      workload=workload, scale={"mode": mode, "script": name, **config})


def check_cores(cores: int) -> None:
    machine = cpu_topology().physical_cores
    if cores > machine:
        raise InputError(f"--cores {cores} is more than this machine's {machine} physical cores")


def strong_layouts(job: ScriptJob, grid: list[tuple[int, int]],
                   global_batch: int | None) -> tuple[list[tuple[int, int, list[str]]], int | None, list[str]]:
    """Each layout's (ranks, threads, argv), the global batch kept (None: the script's own
    per-rank batch everywhere) and notes on layouts left out."""
    if job.batch_arg is None:
        if global_batch is not None:
            raise InputError("--global-batch needs --batch-arg FLAG: the script's per-rank batch option, which "
                             "scale sets to global / ranks in each layout")
        return [(r, t, job.argv) for r, t in grid], None, []
    kept = global_batch or batch_value(job.argv, job.batch_arg)
    if kept is None:
        raise InputError(f"--batch-arg {job.batch_arg}: the script's arguments do not give it; add it to them "
                         "or give --global-batch N")
    uneven = sorted({r for r, _ in grid if kept % r})
    notes = [f"skipped {', '.join(map(str, uneven))} ranks: global batch {kept} does not split evenly"] if uneven else []
    layouts = [(r, t, with_batch(job.argv, job.batch_arg, kept // r)) for r, t in grid if kept % r == 0]
    if not layouts:
        raise InputError(f"no layout splits the global batch {kept} evenly over its ranks")
    return layouts, kept, notes


def scale_script(argv: list[str], cores: int, *, global_batch: int | None = None, batch_arg: str | None = None,
                 ranks: list[int] | None = None, threads: list[int] | None = None, steps: int = 8,
                 warmup: int = 2, runs_dir: Path | str = "runs", timeout: float = 1800.0,
                 progress: ProgressFn | None = None, nodes: Nodes | None = None) -> ScaleResult:
    """Table 3 of the user's script: every (ranks, threads) with ranks x threads <= ``cores``
    (with ``nodes``: on every node, node rank 0 here and ``profilednn follow`` on the others)."""
    check_cores(cores)
    job = checked_job(argv, steps, warmup, timeout, batch_arg)
    grid = rank_thread_grid(cores, ranks, threads)
    if not grid:
        raise InputError(f"no ranks x threads combination fits {cores} cores (ranks x threads per rank <= cores)")
    layouts, kept, notes = strong_layouts(job, grid, global_batch)
    config = {"cores": cores, "global_batch": kept, "batch_arg": batch_arg, "steps": steps, "warmup": warmup,
              "nnodes": nodes.nnodes if nodes else 1}
    with hosting(nodes) as host, study_run(Path(runs_dir), "strong", job, config) as run:  # failed: none measured
        rows, failed = run_points([(f"{r} ranks x {t} threads", lambda r=r, t=t, a=a: layout_row(
            launch_layout(job, a, r, t, run.path / "jobs" / f"r{r}t{t}", host), r, t, f"r{r}t{t}",
            kept // r if kept else None)) for r, t, a in layouts], progress, (LayoutFailed,))
        notes += failed + nodes_note(nodes)
        base = normalise(rows, weak=False)
        reference = kept or (base["local_batch"] * 1 if base["local_batch"] else None)
        notes += batch_notes(rows, reference, kept is not None) + comm_note(rows)
        notes.append(f"normalized to {base['ranks']} rank(s) x {base['threads']} thread(s) = 1.00 (Table 3's corner)")
        return finish_study(run, rows, "strong", notes)


def weak_script(argv: list[str], cores: int, *, ranks: list[int] | None = None, threads_per_rank: int = 1,
                steps: int = 8, warmup: int = 2, runs_dir: Path | str = "runs", timeout: float = 1800.0,
                progress: ProgressFn | None = None, nodes: Nodes | None = None) -> ScaleResult:
    """Weak scaling of the user's script: its per-rank batch kept, ranks added (on every node, with ``nodes``)."""
    check_cores(cores)
    job = checked_job(argv, steps, warmup, timeout, None)
    rank_list = [r for r, _ in rank_thread_grid(cores, ranks, [threads_per_rank])]
    if not rank_list:
        raise InputError(f"{threads_per_rank} threads per rank do not fit in {cores} cores")
    config = {"cores": cores, "threads_per_rank": threads_per_rank, "steps": steps, "warmup": warmup,
              "nnodes": nodes.nnodes if nodes else 1}
    with hosting(nodes) as host, study_run(Path(runs_dir), "weak", job, config) as run:
        rows, failed = run_points([(f"{r} ranks", lambda r=r: layout_row(
            launch_layout(job, job.argv, r, threads_per_rank, run.path / "jobs" / f"weak-r{r}", host),
            r, threads_per_rank, f"weak-r{r}", None)) for r in rank_list], progress, (LayoutFailed,))
        base = normalise(rows, weak=True)
        local = base["local_batch"]
        notes = [f"weak scaling: the script's per-rank batch ({local if local else 'not read'}) kept, global batch = "
                 "ranks x it; efficiency = throughput / (ranks x one rank's throughput)", *comm_note(rows), *failed,
                 *nodes_note(nodes)]
        if local is None:
            notes += batch_notes(rows, None, False)
        return finish_study(run, rows, "weak", notes)


def checked_job(argv: list[str], steps: int, warmup: int, timeout: float, batch_arg: str | None) -> ScriptJob:
    """The study's ``ScriptJob``; bad settings as one line each."""
    if not argv:
        raise InputError("give the script after `--`, e.g. `profilednn scale -- python train.py`")
    if steps < 1 or warmup < 0:
        raise InputError(f"--steps must be >= 1 and --warmup >= 0, not {steps} and {warmup}")
    if timeout <= 0:
        raise InputError(f"--timeout must be > 0 seconds, not {timeout}")
    if batch_arg is not None and not batch_arg.startswith("-"):
        raise InputError(f"--batch-arg takes the script's option, e.g. --batch-size, not {batch_arg!r}")
    from ..capture.script_target import script_target

    script_target(list(argv))  # the script exists: one line before any launch
    return ScriptJob(list(argv), steps=steps, warmup=warmup, timeout=timeout, batch_arg=batch_arg)


__all__ = ["LayoutFailed", "NotDistributed", "ScriptJob", "batch_value", "launch_arm", "scale_script", "trained_alone",
           "weak_script", "with_batch"]

"""The distributed job's terminal printer: the plan of ``launch``, the per-rank table of
``train`` / ``ranks``, and the tables of ``scale``, ``convergence`` and ``project-nodes``.

(``report.py`` beside it holds the job's HTML section.) Below
:data:`~profilednn.formatting.FULL_TABLE_WIDTH` columns the wide tables keep their
essential columns; ``wide=True`` (the verbs' ``--wide``) shows every one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from rich.table import Table

from ..formatting import full_tables, print_table, styled

if TYPE_CHECKING:
    from pathlib import Path

    import polars as pl
    from rich.console import Console

    from ..run import Run
    from .convergence import ConvergenceResult
    from .launch import PreparedLaunch
    from .scale import ScaleResult

# (header, column, format, essential): non-essential columns show in wide tables only
Column = tuple[str, str, str, bool]


def _columns(columns: Sequence[Column], console: Console, wide: bool) -> list[Column]:
    full = full_tables(console, wide)
    return [c for c in columns if full or c[3]]


def _cell(row: dict[str, Any], key: str, fmt: str) -> str:
    return fmt.format(row[key]) if row.get(key) is not None else ""


def cpu_ranges(cpus: Iterable[int]) -> str:
    """CPU ids as ranges: ``0-3,8,10-11``."""
    ids = sorted(cpus)
    out, i = [], 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(out)


def print_plan(prepared: PreparedLaunch, console: Console) -> None:
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
                      cpu_ranges(slot.cpus), str(plan.threads_per_rank), prepared.runtime.memory(slot.local_rank))
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


RANK_COLUMNS: tuple[Column, ...] = (
    ("rank", "rank", "{}", True), ("step ms", "step_ms", "{:.1f}", True), ("compute", "compute_ms", "{:.1f}", True),
    ("allreduce", "allreduce_ms", "{:.1f}", True), ("exposed", "exposed_comm_ms", "{:.1f}", True),
    ("comm %", "comm_share", "{:.0%}", True), ("vs median", "slowdown", "{:.2f}x", False),
    ("slowest", "slowest_steps", "{}", False))


def print_ranks(per_rank: pl.DataFrame, title: str, console: Console, *, wide: bool = False) -> None:
    """The merged per-rank table: step, compute, allreduce and exposed communication."""
    table = Table(title=title, title_justify="left",
                  caption="ms are medians per step; exposed = allreduce time not hidden under compute; "
                          "slowest = steps in which this rank computed longest", caption_justify="left")
    cols = _columns(RANK_COLUMNS, console, wide)
    for head, _, _, _ in cols:
        table.add_column(head, justify="right")
    table.add_column("strag.")
    for row in per_rank.iter_rows(named=True):
        table.add_row(*[_cell(row, key, fmt) for _, key, fmt, _ in cols],
                      styled("yes", "red") if row.get("straggler") else "")
    print_table(console, table, wide=wide)


SCALE_COLUMNS: tuple[Column, ...] = (
    ("ranks", "ranks", "{}", True), ("threads", "threads", "{}", True), ("local", "local_batch", "{}", False),
    ("global", "global_batch", "{}", True), ("step ms", "step_ms", "{:.1f}", True),
    ("compute", "compute_ms", "{:.1f}", False), ("exposed comm", "exposed_comm_ms", "{:.1f}", False),
    ("items/s", "items_per_s", "{:.1f}", True), ("norm.", "normalized", "{:.2f}", True),
    ("eff.", "efficiency", "{:.0%}", True))


def print_scale(result: ScaleResult, console: Console, *, wide: bool = False) -> None:
    """The normalized-throughput pivot (strong scaling), one row per configuration, the Run."""
    t = result.table
    if t["mode"][0] == "strong":
        pivot = result.pivot()
        batches = sorted({b for b in t["global_batch"].to_list() if b is not None})
        batch = (f"global batch {batches[0]}" if len(batches) == 1
                 else "global batch per layout: see below" if batches else "global batch not read")
        table = Table(title=f"normalized throughput, {batch} (rows: threads per rank)", title_justify="left")
        table.add_column("threads \\ ranks", justify="right")
        for col in pivot.columns[1:]:
            table.add_column(str(col), justify="right")
        for row in pivot.iter_rows():
            table.add_row(str(row[0]), *[f"{v:.2f}" if v is not None else "-" for v in row[1:]])
        console.print(table)
    detail = Table(title="per configuration", title_justify="left")
    cols = _columns(SCALE_COLUMNS, console, wide)
    for head, _, _, _ in cols:
        detail.add_column(head, justify="right")
    for r in t.sort(["ranks", "threads"]).iter_rows(named=True):
        detail.add_row(*[_cell(r, key, fmt) for _, key, fmt, _ in cols])
    print_table(console, detail, wide=wide)
    for note in result.notes:
        console.print(styled("note:", "yellow", f" {note}"), highlight=False)
    console.print(f"chart: {result.run.path / 'scale.png'}", highlight=False, soft_wrap=True)
    console.print(f"Run: {result.run.path}", highlight=False, soft_wrap=True)


def print_convergence(result: ConvergenceResult, target: float, lr_scaling: str, console: Console) -> None:
    """Epochs and steps to the target accuracy per global batch, the advice, the Run."""
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


NODE_COLUMNS: tuple[Column, ...] = (
    ("nodes", "nodes", "{}", True), ("ranks", "ranks", "{}", True), ("global batch", "global_batch", "{}", False),
    ("compute ms", "compute_ms", "{:.1f}", False), ("allreduce ms", "allreduce_ms", "{:.2f}", False),
    ("step ms", "step_ms", "{:.1f}", True), ("items/s", "items_per_s", "{:.0f}", True),
    ("speedup", "speedup", "{:.1f}x", True), ("efficiency", "efficiency", "{:.0%}", True))


def print_node_projection(table_df: pl.DataFrame, notes: Sequence[str], source_path: Path, console: Console,
                          *, wide: bool = False) -> None:
    """Throughput and efficiency per node count, the model's assumptions and notes."""
    from .projection import ASSUMPTIONS

    table = Table(title=f"projection from {source_path.name}", title_justify="left")
    cols = _columns(NODE_COLUMNS, console, wide)
    for head, _, _, _ in cols:
        table.add_column(head, justify="right")
    for r in table_df.iter_rows(named=True):
        table.add_row(*[_cell(r, key, fmt) for _, key, fmt, _ in cols])
    print_table(console, table, wide=wide)
    for a in ASSUMPTIONS:
        console.print(f"assumes: {a}", highlight=False)
    for n in notes:
        console.print(styled("note:", "yellow", f" {n}"), highlight=False)
    console.print(f"written to {source_path} (table dist_projection)", highlight=False, soft_wrap=True)


def print_run_sections(run: Run, console: Console, *, wide: bool = False) -> bool:
    """A Run's per-rank, scale or convergence table as ``ranks`` / ``scale`` /
    ``convergence`` printed it (for ``report``); False when it has none of them."""
    from ..tables import CONVERGENCE, DIST_RANKS, DIST_STEPS, SCALE

    notes = list(run.manifest.get("notes") or [])
    if run.has_table(DIST_RANKS):
        print_ranks(run.table(DIST_RANKS), f"{run.path.name}: every rank", console, wide=wide)
    elif run.has_table(DIST_STEPS):  # a rank other than 0: its own steps, as ``ranks`` merges them
        from .merge import merge_rank_steps

        print_ranks(merge_rank_steps(run.table(DIST_STEPS)).per_rank, f"{run.path.name}: this rank (medians "
                    "after its first step)", console, wide=wide)
    if run.has_table(SCALE):
        from .scale import ScaleResult

        print_scale(ScaleResult(run, run.table(SCALE), notes), console, wide=wide)
    if run.has_table(CONVERGENCE):
        from .convergence import ConvergenceResult

        study = run.manifest.get("convergence") or {}
        result = ConvergenceResult(run, run.table(CONVERGENCE), list(run.manifest.get("advice") or []))
        print_convergence(result, float(study.get("target", 0.0)), str(study.get("lr_scaling", "?")), console)
    return any(run.has_table(t) for t in (DIST_RANKS, DIST_STEPS, SCALE, CONVERGENCE))


__all__ = ["cpu_ranges", "print_convergence", "print_node_projection", "print_plan", "print_ranks",
           "print_run_sections", "print_scale"]

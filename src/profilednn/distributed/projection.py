"""Projection to more nodes: measured compute + an alpha-beta allreduce, for 1..64 nodes.

Model (weak scaling, stated so a reader can disagree with it):

- every rank keeps its local batch, so its compute time per step stays what was measured;
- each step allreduces the gradients once (``grad_bytes``, measured from the DDP buckets)
  with a ring over all ``nodes x ranks_per_node`` ranks, costing
  ``2 (p-1) alpha + 2 (p-1)/p * bytes * beta``; one (alpha, beta) for every link, no
  contention, no hierarchy;
- a fraction ``overlap`` of that allreduce hides under backward (measured on the source
  job as 1 - exposed/allreduce; 0 when unknown);
- step time = compute + (1 - overlap) x allreduce; throughput = ranks x local batch / step.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from ..errors import InputError, RunError
from ..run import Run, load_run
from ..tables import DIST_PROJECTION, DIST_RANKS
from .comm import AlphaBeta

NODE_COUNTS = (1, 2, 4, 8, 16, 32, 64)
ASSUMPTIONS = (
    "weak scaling: local batch and per-rank compute time fixed at the measured values",
    "one ring allreduce of the gradients per step: 2(p-1)·alpha + 2(p-1)/p·bytes·beta",
    "one alpha and beta for every link; no network contention, no hierarchical allreduce",
    "a fixed fraction of the allreduce hides under backward (the measured overlap)",
)


@dataclass(frozen=True)
class NodeProjection:
    compute_ms: float
    grad_bytes: float
    ranks_per_node: int
    local_batch: int
    alpha_beta: AlphaBeta
    overlap: float = 0.0

    def table(self, max_nodes: int = 64) -> pl.DataFrame:
        if max_nodes < 1:
            raise InputError(f"--max-nodes must be >= 1, not {max_nodes}")
        rows = []
        nodes = [n for n in NODE_COUNTS if n <= max_nodes] + ([max_nodes] if max_nodes not in NODE_COUNTS else [])
        for n in sorted(set(nodes)):
            p = n * self.ranks_per_node
            comm_ms = self.alpha_beta.allreduce_s(self.grad_bytes, p) * 1e3
            step_ms = self.compute_ms + (1.0 - self.overlap) * comm_ms
            rows.append({"nodes": n, "ranks": p, "global_batch": p * self.local_batch, "compute_ms": self.compute_ms,
                         "allreduce_ms": comm_ms, "exposed_comm_ms": (1.0 - self.overlap) * comm_ms,
                         "step_ms": step_ms, "items_per_s": p * self.local_batch / (step_ms / 1e3)})
        one = rows[0]["items_per_s"] / rows[0]["nodes"]  # throughput per node on the fewest nodes
        for row in rows:
            row["speedup"] = row["items_per_s"] / one
            row["efficiency"] = row["items_per_s"] / (one * row["nodes"])
        return DIST_PROJECTION.frame(rows)


def _rank0(run_or_job: Path | str) -> Run:
    p = Path(run_or_job)
    if (p / "manifest.json").exists():
        return load_run(p)
    from .merge import rank_runs

    return rank_runs(p)[0]


def projection_from_run(
    run_or_job: Path | str,
    *,
    alpha_beta: AlphaBeta | None = None,
    ranks_per_node: int | None = None,
    overlap: float | None = None,
) -> tuple[NodeProjection, list[str], Run]:
    """Build the projection from a rank-0 Run of ``profilednn train`` (or its job directory)."""
    run = _rank0(run_or_job)
    if not run.has_table(DIST_RANKS):
        raise RunError(f"{run.path} has no merged rank table (dist_ranks): give the rank-0 Run of "
                       "`profilednn train`")
    d = run.manifest.get("distributed") or {}
    per_rank = run.table(DIST_RANKS)
    compute_ms = float(per_rank["compute_ms"].max())  # the slowest rank sets the pace
    grad_bytes = float(per_rank["allreduce_bytes"].max() or 0)
    notes: list[str] = []
    if grad_bytes <= 0:
        raise RunError(f"{run.path} ran on one rank, so no gradient bytes were measured; train with "
                       ">= 2 ranks under `profilednn launch` first")
    if alpha_beta is None:
        ab = run.manifest.get("alpha_beta")
        if not ab:
            raise RunError(f"{run.path} has no allreduce measurement (trained with --no-comm?); pass "
                           "--alpha-us and --bandwidth-gbps")
        alpha_beta = AlphaBeta(float(ab["alpha_s"]), float(ab["beta_s_per_byte"]), int(ab["ranks"]), "measured")
        notes.append(f"alpha-beta measured on this machine over {ab['ranks']} ranks (loopback: a real network "
                     "has more latency and less bandwidth; pass --alpha-us/--bandwidth-gbps for yours)")
    if overlap is None:
        ar = float(per_rank["allreduce_ms"].median() or 0.0)
        ex = float(per_rank["exposed_comm_ms"].median() or 0.0)
        overlap = max(0.0, min(1.0, 1.0 - ex / ar)) if ar > 0 else 0.0
        notes.append(f"overlap {overlap:.0%} of the allreduce hidden under backward (measured)")
    if not 0.0 <= overlap <= 1.0:
        raise InputError(f"--overlap must be in [0, 1], not {overlap}")
    proj = NodeProjection(compute_ms=compute_ms, grad_bytes=grad_bytes,
                          ranks_per_node=ranks_per_node or int(d.get("world_size", 1)),
                          local_batch=int(d.get("local_batch", 1)), alpha_beta=alpha_beta, overlap=overlap)
    return proj, notes, run


def project_nodes(
    run_or_job: Path | str,
    *,
    max_nodes: int = 64,
    alpha_beta: AlphaBeta | None = None,
    ranks_per_node: int | None = None,
    overlap: float | None = None,
    write: bool = True,
) -> tuple[pl.DataFrame, list[str], Run]:
    """Predicted throughput and scaling efficiency for 1..``max_nodes`` nodes; written into the Run."""
    proj, notes, run = projection_from_run(run_or_job, alpha_beta=alpha_beta, ranks_per_node=ranks_per_node,
                                           overlap=overlap)
    table = proj.table(max_nodes)
    if write:
        run.write_table(DIST_PROJECTION, table)
        run.update(projection={"compute_ms": proj.compute_ms, "grad_bytes": proj.grad_bytes,
                               "ranks_per_node": proj.ranks_per_node, "local_batch": proj.local_batch,
                               "overlap": proj.overlap, "alpha_beta": proj.alpha_beta.to_dict(),
                               "assumptions": list(ASSUMPTIONS), "notes": notes})
    return table, notes, run


__all__ = ["ASSUMPTIONS", "NODE_COUNTS", "NodeProjection", "project_nodes", "projection_from_run"]

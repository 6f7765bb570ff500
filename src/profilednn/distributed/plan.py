"""The launch plan: how many ranks, how many threads each, and which cores each one owns.

Seed 000, section 3: one OpenMP thread per physical core, and no rank spanning a socket
(its threads would share memory across the socket link). Ranks are spread evenly over
the sockets, then over the NUMA nodes inside a socket; each rank gets a contiguous block
of cores and is pinned to the first logical CPU of each (hyperthread siblings stay free).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import InputError
from ..topology import Core, CpuTopology


class PlanError(InputError):
    """A ranks x threads plan that this machine cannot run (refused before anything starts)."""


@dataclass(frozen=True)
class RankSlot:
    """One local rank: the cores it owns and the logical CPUs it is pinned to."""

    local_rank: int
    cores: tuple[int, ...]  # indices into the topology's physical core list
    cpus: tuple[int, ...]  # logical CPUs (first hyperthread of each core)
    sockets: tuple[int, ...]
    numa_nodes: tuple[int, ...]

    @property
    def spans_socket(self) -> bool:
        return len(self.sockets) > 1

    @property
    def spans_numa(self) -> bool:
        return len(self.numa_nodes) > 1


@dataclass(frozen=True)
class LaunchPlan:
    """Ranks x threads on this node, with the cluster shape around it."""

    nproc_per_node: int
    threads_per_rank: int
    ranks: tuple[RankSlot, ...]
    physical_cores: int
    sockets: int
    numa_nodes: int
    nnodes: int = 1
    node_rank: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def idle_cores(self) -> int:
        return self.physical_cores - self.nproc_per_node * self.threads_per_rank

    def slot(self, local_rank: int) -> RankSlot:
        return self.ranks[local_rank]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "LaunchPlan":
        ranks = tuple(
            RankSlot(
                local_rank=int(r["local_rank"]), cores=tuple(r["cores"]), cpus=tuple(r["cpus"]),
                sockets=tuple(r["sockets"]), numa_nodes=tuple(r["numa_nodes"]),
            )
            for r in data["ranks"]
        )
        fields = {k: v for k, v in data.items() if k not in ("ranks", "notes")}
        return cls(ranks=ranks, notes=tuple(data.get("notes") or ()), **fields)


def rank_env(plan: LaunchPlan, local_rank: int) -> dict[str, str]:
    """The thread and affinity variables one rank runs with.

    ``OMP_PLACES``/``OMP_PROC_BIND`` are standard OpenMP (GNU libgomp, which stock PyTorch
    wheels use, and Intel's libiomp); MKL takes its thread count from ``MKL_NUM_THREADS``.
    Intel OpenMP's ``KMP_*`` variables are added by :mod:`.rank_runtime` when libiomp5 is
    the runtime the ranks load.
    """
    slot = plan.slot(local_rank)
    threads = str(plan.threads_per_rank)
    cpus = ",".join(str(c) for c in slot.cpus)
    return {
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "OMP_PLACES": ",".join(f"{{{c}}}" for c in slot.cpus),
        "OMP_PROC_BIND": "close",
        "PROFILEDNN_CPUS": cpus,
        "PROFILEDNN_THREADS_PER_RANK": threads,
    }


def _blocks(cores: list[Core], count: int, size: int) -> list[list[Core]] | None:
    """``count`` contiguous blocks of ``size`` cores, spread over NUMA nodes when they fit."""
    if count * size > len(cores):
        return None
    by_node: dict[int, list[Core]] = {}
    for c in cores:
        by_node.setdefault(c.node, []).append(c)
    nodes = sorted(by_node)
    per_node = [count // len(nodes) + (1 if i < count % len(nodes) else 0) for i in range(len(nodes))]
    if all(n * size <= len(by_node[node]) for n, node in zip(per_node, nodes)):
        out: list[list[Core]] = []
        for n, node in zip(per_node, nodes):
            pool = by_node[node]
            out += [pool[i * size:(i + 1) * size] for i in range(n)]
        return out
    return [cores[i * size:(i + 1) * size] for i in range(count)]  # some rank spans a node


def _spread(topology: CpuTopology, ranks: int, threads: int) -> list[list[Core]] | None:
    """Ranks spread evenly over sockets with no rank spanning one; None when impossible."""
    sockets = topology.socket_ids()
    ordered = {s: sorted(topology.cores_of_socket(s), key=lambda c: (c.node, c.core)) for s in sockets}
    # Even spread first (best memory bandwidth), then first-fit packing.
    counts = [ranks // len(sockets) + (1 if i < ranks % len(sockets) else 0) for i in range(len(sockets))]
    if all(n * threads <= len(ordered[s]) for n, s in zip(counts, sockets)):
        out: list[list[Core]] = []
        for n, s in zip(counts, sockets):
            out += _blocks(ordered[s], n, threads) or []
        return out
    out = []
    for s in sockets:
        fit = min(len(ordered[s]) // threads, ranks - len(out))
        out += _blocks(ordered[s], fit, threads) or []
    return out if len(out) == ranks else None


def make_plan(
    topology: CpuTopology,
    nproc_per_node: int,
    threads_per_rank: int | None = None,
    *,
    allow_span: bool = False,
    nnodes: int = 1,
    node_rank: int = 0,
) -> LaunchPlan:
    """Plan ``nproc_per_node`` ranks of ``threads_per_rank`` threads on ``topology``.

    ``threads_per_rank`` defaults to the cores divided evenly among the ranks. A plan that
    needs more cores than the machine has, or (without ``allow_span``) one where a rank
    would span a socket, raises PlanError naming a plan that would work.
    """
    cores_total = topology.physical_cores
    if nproc_per_node < 1:
        raise PlanError(f"--nproc-per-node must be >= 1, not {nproc_per_node}")
    if nnodes < 1:
        raise PlanError(f"--nnodes must be >= 1, not {nnodes}")
    if not 0 <= node_rank < nnodes:
        raise PlanError(f"--node-rank must be in [0, {nnodes - 1}] for --nnodes {nnodes}, not {node_rank}")
    if nproc_per_node > cores_total:
        raise PlanError(
            f"{nproc_per_node} ranks need at least {nproc_per_node} cores; this machine has "
            f"{cores_total} physical cores (one thread per core): use --nproc-per-node <= {cores_total}"
        )
    if threads_per_rank is None:
        threads_per_rank = cores_total // nproc_per_node
    if threads_per_rank < 1:
        raise PlanError(f"--threads-per-rank must be >= 1, not {threads_per_rank}")
    if nproc_per_node * threads_per_rank > cores_total:
        raise PlanError(
            f"{nproc_per_node} ranks x {threads_per_rank} threads = {nproc_per_node * threads_per_rank} "
            f"threads, but this machine has {cores_total} physical cores; use --threads-per-rank "
            f"<= {cores_total // nproc_per_node}"
        )
    notes: list[str] = []
    blocks = _spread(topology, nproc_per_node, threads_per_rank)
    if blocks is None:
        per_socket = min(len(topology.cores_of_socket(s)) for s in topology.socket_ids())
        hint = _no_span_hint(topology, nproc_per_node)
        if not allow_span:
            raise PlanError(
                f"{nproc_per_node} ranks x {threads_per_rank} threads cannot be placed on "
                f"{topology.sockets} sockets of {per_socket} cores without a rank spanning a "
                f"socket; {hint}, or pass --allow-span"
            )
        ordered = sorted(topology.cores, key=lambda c: (c.socket, c.node, c.core))
        blocks = [ordered[i * threads_per_rank:(i + 1) * threads_per_rank] for i in range(nproc_per_node)]
        notes.append("--allow-span: some ranks span sockets (threads share memory across the socket link)")
    index = {c: i for i, c in enumerate(topology.cores)}
    slots = tuple(
        RankSlot(
            local_rank=r,
            cores=tuple(index[c] for c in block),
            cpus=tuple(c.cpus[0] for c in block),
            sockets=tuple(sorted({c.socket for c in block})),
            numa_nodes=tuple(sorted({c.node for c in block})),
        )
        for r, block in enumerate(blocks)
    )
    if any(s.spans_numa and not s.spans_socket for s in slots):
        notes.append("some ranks span NUMA nodes inside a socket (allowed; memory is farther)")
    idle = cores_total - nproc_per_node * threads_per_rank
    if idle:
        notes.append(f"{idle} of {cores_total} physical cores stay idle")
    if topology.threads_per_core > 1:
        notes.append("one thread per physical core: hyperthread siblings are left free")
    return LaunchPlan(
        nproc_per_node=nproc_per_node, threads_per_rank=threads_per_rank, ranks=slots,
        physical_cores=cores_total, sockets=topology.sockets, numa_nodes=topology.numa_nodes,
        nnodes=nnodes, node_rank=node_rank, notes=tuple(notes),
    )


def _no_span_hint(topology: CpuTopology, ranks: int) -> str:
    sizes = [len(topology.cores_of_socket(s)) for s in topology.socket_ids()]
    per_rank = [min(n // max(1, -(-ranks // len(sizes))), n) for n in sizes]
    best = min(per_rank)
    if best >= 1:
        return f"use --threads-per-rank <= {best}"
    return f"use --nproc-per-node <= {sum(sizes)}"


def rank_thread_grid(cores: int, ranks: list[int] | None = None, threads: list[int] | None = None) -> list[tuple[int, int]]:
    """(ranks, threads) pairs with ranks x threads <= cores (powers of two and ``cores``)."""
    if cores < 1:
        raise PlanError(f"--cores must be >= 1, not {cores}")

    def ladder(limit: int) -> list[int]:
        out, v = [], 1
        while v <= limit:
            out.append(v)
            v *= 2
        if limit not in out:
            out.append(limit)
        return out

    rank_list = sorted(set(ranks)) if ranks else ladder(cores)
    thread_list = sorted(set(threads)) if threads else ladder(cores)
    return [(r, t) for t in thread_list for r in rank_list if r * t <= cores]


__all__ = ["LaunchPlan", "PlanError", "RankSlot", "make_plan", "rank_env", "rank_thread_grid"]

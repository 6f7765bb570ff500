"""Where a user's data-parallel job runs when it spans nodes: ``optimize``, ``scale`` and
``apply`` of a script on node rank 0, ``profilednn follow`` on every other node.

ProfileDNN starts no process on another machine: node rank 0 runs the verb and hosts a
control store (``torch.distributed.TCPStore``) on ``--master-addr:--master-port``; on each
other node the user runs ``profilednn follow`` with the same four options, which connects
to it and launches that node's part of every job node 0 launches (``control.py``,
``follower.py``). This module is the options alone (no PyTorch: the CLI reads it while it
starts).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from ..errors import InputError

DEFAULT_CONTROL_PORT = 29500  # prepare.DEFAULT_MASTER_PORT, torchrun's default master port


@dataclass(frozen=True)
class Nodes:
    """The nodes of a job: how many, which one this is, where node rank 0's control store
    listens (``master_port`` None: 29500), and how long one node waits for another
    (``timeout``: a follower taking up a launch or sending its ranks' results; seconds)."""

    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    timeout: float = 300.0

    @property
    def several(self) -> bool:
        return self.nnodes > 1

    @property
    def port(self) -> int:
        return self.master_port if self.master_port is not None else DEFAULT_CONTROL_PORT

    @property
    def followers(self) -> list[int]:
        return list(range(1, self.nnodes))

    def check(self, verb: str) -> None:
        """One line naming the first bad option. ``verb``: ``follow`` runs on nodes 1..N-1,
        any other verb on node rank 0."""
        if self.nnodes < 1:
            raise InputError(f"--nnodes must be >= 1, not {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise InputError(f"--node-rank must be in [0, {self.nnodes - 1}] for --nnodes {self.nnodes}, "
                             f"not {self.node_rank}")
        if self.timeout <= 0:
            raise InputError(f"--node-timeout must be > 0 seconds, not {self.timeout:g}")
        if not 0 < self.port < 65536:
            raise InputError(f"--master-port must be in 1..65535, not {self.port}")
        if self.several and not self.master_addr:
            raise InputError("--nnodes > 1 needs --master-addr (the address of node rank 0, which hosts the "
                             "control store) and --master-port")
        if verb == "follow" and self.node_rank == 0:
            raise InputError("profilednn follow runs on the nodes of rank 1 and up; on node rank 0 run the verb "
                             "itself (optimize, scale or apply with --nnodes)")
        if verb != "follow" and self.node_rank != 0:
            raise InputError(f"profilednn {verb} runs on node rank 0, which starts every job; on node rank "
                             f"{self.node_rank} run: {self.follow_command(self.node_rank)}")

    def follow_command(self, node_rank: int) -> str:
        """What the user runs on node ``node_rank``."""
        return shlex.join(["profilednn", "follow", "--nnodes", str(self.nnodes), "--node-rank", str(node_rank),
                           "--master-addr", str(self.master_addr), "--master-port", str(self.port)])


def nodes_of(nnodes: int, node_rank: int, master_addr: str | None, master_port: int | None, timeout: float,
             verb: str) -> Nodes | None:
    """The checked ``Nodes`` of a verb's options; None on one node (``--nnodes 1``)."""
    nodes = Nodes(nnodes, node_rank, master_addr, master_port, timeout)
    nodes.check(verb)
    return nodes if nodes.several else None


__all__ = ["DEFAULT_CONTROL_PORT", "Nodes", "nodes_of"]

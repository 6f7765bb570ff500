"""The control store that lets node rank 0 start a job on every node: node 0 hosts a
``torch.distributed.TCPStore`` on ``--master-addr:--master-port``; ``profilednn follow``
on each other node connects to it and mirrors node 0's launches.

The keys (JSON values; ``N`` a follower's node rank, ``i`` the launch's number from 0):

- ``hello/N``: follower N connected (its host name);
- ``launch/i``: what node 0 launches (``kind`` ``arm``, ``apply`` or ``end``; the arm's
  spec, the environment on top of the launch's, ranks and threads per node, the job's name,
  its rendezvous port and time limits). The spec carries everything the ranks read that is
  not the user's script: no file system is assumed shared, only the script, which every
  node must have at the same path (as under ``profilednn launch``);
- ``took/i/N``: follower N started its part; ``cancel/i``: node 0 gave up on launch i (a
  follower that takes it late skips it);
- ``result/i/N``: what follower N's ranks left: each rank's result (``result.rank<R>.json``,
  by global rank), the job's failure, its exit code and the tail of its output (sent
  instead of ``took`` when N cannot make its plan: node 0 then starts nothing);
- ``bye/N``: follower N saw the ``end`` launch and exits 0.

Each launch's torchrun rendezvous is on a port node 0 picks free on ``--master-addr`` and
publishes (gloo's connections between the ranks use free ports too).
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator

from ..errors import InputError
from .node_settings import Nodes
from .plan import PlanError
from .preflight import check_master, free_port, resolve_address
from .watchdog import JobFailed

POLL_S = 0.2  # how often a waiting side looks again (and notices a closed store)
OUTPUT_TAIL = 64 * 1024  # characters of a follower's output sent back with its results
BYE_WAIT_S = 10.0


class NodeMissing(JobFailed):
    """A follower did not take up a launch, or sent no result for it, in time."""


def _key(*parts: object) -> str:
    return "profilednn/" + "/".join(map(str, parts))


def _store(nodes: Nodes, host: bool) -> Any:
    from torch.distributed import TCPStore

    return TCPStore(resolve_address(str(nodes.master_addr)), nodes.port, is_master=host, wait_for_workers=False,
                    timeout=timedelta(seconds=nodes.timeout))


def _wait(store: Any, key: str, seconds: float | None, *others: str) -> bool:
    """Whether ``key`` (or one of ``others``) appeared within ``seconds`` (None: as long as
    the store is there; a closed store raises ``DistNetworkError``). Polled with ``check``:
    a ``wait`` that times out logs a warning from c10d each time."""
    deadline = None if seconds is None else time.monotonic() + seconds
    while not any(store.check([k]) for k in (key, *others)):
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - time.monotonic())))
    return True


def _get(store: Any, key: str) -> dict[str, Any]:
    return json.loads(store.get(key).decode("utf-8"))


def _set(store: Any, key: str, value: dict[str, Any]) -> None:
    store.set(key, json.dumps(value))


class ControlHost:
    """Node rank 0's side: publishes each launch and gathers the followers' results."""

    def __init__(self, nodes: Nodes) -> None:
        self.nodes = nodes
        self.launches = 0
        try:
            self.store = _store(nodes, host=True)
        except RuntimeError as exc:
            raise InputError(f"node rank 0 cannot host the control store on {nodes.master_addr}:{nodes.port} "
                             f"({str(exc).splitlines()[0]}): --master-addr must be an address of this machine and "
                             "--master-port a free port") from None

    @property
    def nnodes(self) -> int:
        return self.nodes.nnodes

    def wait_for_followers(self) -> None:
        """Every follower connected within the node timeout, else one line naming the first missing."""
        for node in self.nodes.followers:
            if not _wait(self.store, _key("hello", node), self.nodes.timeout):
                raise InputError(f"node {node} did not connect to the control store {self.nodes.master_addr}:"
                                 f"{self.nodes.port} within --node-timeout {self.nodes.timeout:g} s: run "
                                 f"`{self.nodes.follow_command(node)}` on it")

    def placement(self) -> dict[str, Any]:
        """Node 0's ``LaunchSettings`` fields for its part of the next launch: the nodes, and
        a rendezvous port free on ``--master-addr`` now."""
        port = free_port(resolve_address(str(self.nodes.master_addr)))
        return {"nnodes": self.nnodes, "node_rank": 0, "master_addr": self.nodes.master_addr, "master_port": port,
                "rdzv_timeout": self.nodes.timeout}

    def publish(self, kind: str, job: str, port: int, **launch: Any) -> None:
        """Launch ``launch`` (spec, env, ranks, threads, timeout) as job ``job`` with its
        rendezvous on ``port`` on every follower. ``NodeMissing`` (naming the node) when a
        follower does not take it up within the node timeout; ``JobFailed`` with its reason
        when it cannot run its part."""
        index = self.launches
        self.launches += 1
        _set(self.store, _key("launch", index), {"kind": kind, "job": job, "port": port, "index": index, **launch})
        for node in self.nodes.followers:
            took, refused = _key("took", index, node), _key("result", index, node)
            if not _wait(self.store, took, self.nodes.timeout, refused):
                self.store.set(_key("cancel", index), "1")
                raise NodeMissing(f"node {node} did not take up {job} within --node-timeout {self.nodes.timeout:g} s "
                                  f"(is `{self.nodes.follow_command(node)}` running there?)")
            if not self.store.check([took]):  # it sent its result instead: it cannot run its part
                self.store.set(_key("cancel", index), "1")
                raise JobFailed(str(_get(self.store, refused).get("failure") or f"node {node} refused {job}"))

    def collect(self, job_dir: Path | None) -> list[dict[str, Any]]:
        """Each follower's result of the last launch, its ranks' result files written into
        ``job_dir`` (and its output appended to ``job_dir/output.log``). ``NodeMissing``
        naming the first node that sent none within the node timeout."""
        index, out = self.launches - 1, []
        for node in self.nodes.followers:
            if not _wait(self.store, _key("result", index, node), self.nodes.timeout):
                raise NodeMissing(f"node {node} sent no result of launch {index} within --node-timeout "
                                  f"{self.nodes.timeout:g} s (its `profilednn follow` stopped, or its part of the "
                                  "job is still running)")
            sent = _get(self.store, _key("result", index, node))
            if job_dir is not None:
                _materialise(job_dir, node, sent)
            out.append({"node": node, **sent})
        return out

    def close(self) -> None:
        """Tell the followers to exit (``end``), give them a moment to say bye, close the store."""
        _set(self.store, _key("launch", self.launches), {"kind": "end", "index": self.launches})
        deadline = time.monotonic() + BYE_WAIT_S
        for node in self.nodes.followers:
            _wait(self.store, _key("bye", node), max(0.1, deadline - time.monotonic()))
        del self.store


def _materialise(job_dir: Path, node: int, sent: dict[str, Any]) -> None:
    """A follower's ranks' results as node 0's own result files; its output after node 0's."""
    for rank, result in (sent.get("results") or {}).items():
        if result is not None:
            (job_dir / f"result.rank{int(rank)}.json").write_text(json.dumps(result), encoding="utf-8")
    if sent.get("output"):
        with open(job_dir / "output.log", "a", encoding="utf-8") as log:
            log.write(f"==> node {node}'s output\n{sent['output']}")
            if not sent["output"].endswith("\n"):
                log.write("\n")


@contextlib.contextmanager
def hosting(nodes: Nodes | None) -> Iterator[ControlHost | None]:
    """The control store for the verb's whole life on node rank 0 (None on one node): the
    followers connected first; at the end, however it ends, told to exit."""
    if nodes is None or not nodes.several:
        yield None
        return
    host = ControlHost(nodes)
    try:
        host.wait_for_followers()
        yield host
    finally:
        host.close()


class ControlClient:
    """A follower's side: the next launch, ``took``, its result, ``bye``."""

    def __init__(self, nodes: Nodes) -> None:
        self.nodes = nodes
        self.index = 0
        self.store = _connect(nodes)
        _set(self.store, _key("hello", nodes.node_rank), {"host": socket.gethostname()})

    def next_launch(self) -> dict[str, Any]:
        """The next launch node 0 publishes (waiting as long as its store is there)."""
        _wait(self.store, _key("launch", self.index), None)
        launch = _get(self.store, _key("launch", self.index))
        self.index += 1
        return launch

    def cancelled(self, launch: dict[str, Any]) -> bool:
        return bool(self.store.check([_key("cancel", launch["index"])]))

    def took(self, launch: dict[str, Any]) -> None:
        self.store.set(_key("took", launch["index"], self.nodes.node_rank), "1")

    def post(self, launch: dict[str, Any], sent: dict[str, Any]) -> None:
        _set(self.store, _key("result", launch["index"], self.nodes.node_rank), sent)

    def bye(self) -> None:
        self.store.set(_key("bye", self.nodes.node_rank), "1")


def _connect(nodes: Nodes) -> Any:
    """The client of node 0's control store, once its port answers (node 0 may start later:
    ``preflight.check_master`` retries with a plain socket until the node timeout, which keeps
    c10d's connect errors quiet)."""
    try:
        check_master(str(nodes.master_addr), nodes.port, nodes.node_rank, connect_timeout=nodes.timeout)
    except PlanError as exc:
        raise InputError(f"node rank 0's control store (--node-timeout {nodes.timeout:g} s): {exc}; it is hosted "
                         "by `profilednn optimize/scale/apply --nnodes ...` on node rank 0") from None
    return _store(nodes, host=False)


__all__ = ["ControlClient", "ControlHost", "NodeMissing", "hosting"]

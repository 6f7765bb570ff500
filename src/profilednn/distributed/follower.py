"""``profilednn follow``: this node's part of every job that ``optimize``, ``scale`` or
``apply`` of a script starts on node rank 0 (``control.py`` says how they talk).

For each launch node 0 publishes, the follower launches the same torchrun job on this
node (same ranks and threads per node, this node's rank, node 0's rendezvous port), pinned
by this machine's plan, in a temporary folder; then it sends back what its ranks left
(each rank's result file, the job's failure, the tail of its output) and waits for the
next. It exits 0 when node 0 says the work is done, 1 when node 0's control store goes
away first. Every job it starts ends under its own watchdog (the launch's ``timeout``).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from ..errors import ProfileDNNError
from .control import OUTPUT_TAIL, ControlClient
from .launch import LaunchSettings, check_master, prepare_launch, run_launch
from .node_settings import Nodes

Say = Callable[[str], None]


def follow(nodes: Nodes, say: Say | None = None) -> int:
    """Mirror node rank 0's launches until it says the work is done; the exit code."""
    from torch.distributed import DistNetworkError

    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    nodes.check("follow")
    client = ControlClient(nodes)
    say(f"node {nodes.node_rank} of {nodes.nnodes}: connected to node rank 0's control store "
        f"{nodes.master_addr}:{nodes.port}; waiting for its launches")
    try:
        while True:
            launch = client.next_launch()
            if launch["kind"] == "end":
                client.bye()
                say(f"node {nodes.node_rank}: node rank 0 is done ({launch['index']} launch(es))")
                return 0
            if client.cancelled(launch):
                say(f"node {nodes.node_rank}: skipped {launch['job']} (node rank 0 gave up on it)")
                continue
            say(f"node {nodes.node_rank}: {launch['kind']} {launch['job']} ({launch['ranks']} rank(s) here)")
            client.post(launch, run_part(launch, nodes, lambda launch=launch: client.took(launch)))
    except DistNetworkError as exc:
        say(f"node {nodes.node_rank}: node rank 0's control store went away before its end "
            f"({str(exc).splitlines()[0]})")
        return 1


def run_part(launch: dict[str, Any], nodes: Nodes, took: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """This node's part of ``launch``, run to its end; what node 0 reads back. ``took`` is
    called once this node's plan is made, before its job starts: node 0 starts its own part
    then. A plan this node cannot make is sent back at once, without ``took`` (node 0 then
    starts nothing)."""
    from ..optimization.script.runner import arm_command

    with tempfile.TemporaryDirectory(prefix="profilednn-follow-") as tmp:
        job_dir = Path(tmp) / str(launch["job"])
        job_dir.mkdir()
        spec_path = job_dir / "spec.json"
        spec_path.write_text(json.dumps(launch["spec"]), encoding="utf-8")
        arm = launch["kind"] == "arm"
        command = arm_command(spec_path, job_dir / "result.rank{rank}.json" if arm else None)
        settings = LaunchSettings(nproc_per_node=int(launch["ranks"]), threads_per_rank=launch.get("threads"),
                                  timeout=float(launch["timeout"]), job_id=str(launch["job"]), runs_dir=job_dir.parent,
                                  nnodes=nodes.nnodes, node_rank=nodes.node_rank, master_addr=nodes.master_addr,
                                  master_port=int(launch["port"]), rdzv_timeout=nodes.timeout)
        log = job_dir / "output.log" if arm else None
        try:  # the master's port is checked after ``took``: node 0 binds it when every follower took the job
            prepared = prepare_launch(command, settings, check=False)
        except ProfileDNNError as exc:  # a plan this node cannot run: node 0 hears why, the follower goes on
            return {"results": {}, "failure": f"node {nodes.node_rank}: {exc}", "exit_code": 1, "output": ""}
        prepared.env.update(launch.get("env") or {})
        took()
        failure, code = None, 0
        try:
            check_master(prepared.master_addr, prepared.master_port, nodes.node_rank,
                         connect_timeout=min(settings.rdzv_timeout, settings.timeout))
            code = run_launch(prepared, log_file=log).exit_code
        except ProfileDNNError as exc:  # the job failed (JobFailed) or node 0's rendezvous never answered
            failure, code = f"node {nodes.node_rank}: {exc}", getattr(exc, "exit_code", 1) or 1
        finally:
            prepared.discard()
        return {"results": _results(job_dir), "failure": failure, "exit_code": code,
                "output": _tail(log) if log is not None else ""}


def _results(job_dir: Path) -> dict[str, Any]:
    """Every rank's result file in ``job_dir``, by global rank (c10d numbers the ranks by arrival)."""
    out = {}
    for path in sorted(job_dir.glob("result.rank*.json")):
        out[path.stem.removeprefix("result.rank")] = json.loads(path.read_text(encoding="utf-8"))
    return out


def _tail(log: Path) -> str:
    if not log.exists():
        return ""
    text = log.read_text(encoding="utf-8", errors="replace")
    return text[-OUTPUT_TAIL:]


__all__ = ["follow", "run_part"]

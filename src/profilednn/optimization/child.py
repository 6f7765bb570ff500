"""Child process for process-level recipes: ``python -m profilednn.optimization.child PAYLOAD RESULT``.

PAYLOAD (written by ``optimize`` with ``torch.save``) says how to rebuild the setup (a
built-in workload by name and arguments, or the pickled setup), which in-process recipes
to apply, and how many steps to run. The child runs the seeded numerics steps, the
warm-up steps and the timed steps under whatever environment it was started with
(LD_PRELOAD, OMP_*), and saves losses, first-step gradients, step times and each timed
step's minor page faults to RESULT.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import torch

from ..capture.page_faults import FaultCounter


def build(payload: dict[str, Any]):
    from ..topology import cpu_topology
    from ..workloads import build_workload
    from .numerics import record_trajectory
    from ..train_step import TrainStep
    from .recipes import Context

    if payload.get("threads") and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(int(payload["threads"]))
    if payload.get("workload"):
        args = dict(payload["workload"])
        setup = build_workload(args.pop("name"), **args)
    else:
        setup = payload["setup"]
        assert isinstance(setup, TrainStep)
    ctx = Context(cpu_topology(), dict(payload.get("options") or {}))
    for recipe in payload["recipes"]:
        recipe.apply(setup, ctx)
    return setup, record_trajectory


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m profilednn.optimization.child PAYLOAD RESULT", file=sys.stderr)
        return 2
    payload = torch.load(argv[0], weights_only=False)
    setup, record_trajectory = build(payload)
    trajectory = record_trajectory(setup, int(payload["numerics_steps"]), int(payload["seed"]))
    for _ in range(int(payload["warmup"])):
        setup.run()
    times, faults = [], FaultCounter()
    for _ in range(int(payload["steps"])):
        t0 = time.perf_counter()
        setup.run()
        times.append((time.perf_counter() - t0) * 1000.0)
        faults.step_end()
    torch.save(
        {
            "losses": trajectory.losses,
            "grads": trajectory.grads,
            "first_step_ms": trajectory.first_step_ms,
            "times_ms": times,
            "faults_per_step": faults.per_step(),
            "threads": torch.get_num_threads(),
            "env": {k: os.environ.get(k) for k in ("LD_PRELOAD", "OMP_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES")},
        },
        argv[1],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

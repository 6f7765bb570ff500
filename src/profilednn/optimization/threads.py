"""``threads``: one OpenMP thread per physical core, pinned (OMP_NUM_THREADS, OMP_PROC_BIND,
OMP_PLACES).

OpenMP reads OMP_* once, when the process starts, so the recipe cannot be switched on in the
running process: ``optimize`` measures it in child processes (``LaunchRecipe``) and reports
the environment to launch training with when it wins.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch

from .recipe_contract import Context, LaunchRecipe


class Threads(LaunchRecipe):
    name = "threads"
    family = "runtime"
    summary = "one OpenMP thread per physical core, pinned (OMP_PROC_BIND=close, OMP_PLACES=cores)"

    def target(self, ctx: Context) -> dict[str, str]:
        return {
            "OMP_NUM_THREADS": str(ctx.topology.physical_cores),
            "OMP_PROC_BIND": "close",
            "OMP_PLACES": "cores",
        }

    def launch_check(self, ctx: Context, env: Mapping[str, str]) -> str | None:
        want = self.target(ctx)
        have = {**{k: os.environ.get(k, "") for k in want}, **{k: v for k, v in env.items() if k in want}}
        if have == want and torch.get_num_threads() == ctx.topology.physical_cores:
            return (f"already one pinned thread per physical core ({ctx.topology.physical_cores}, "
                    "OMP_PROC_BIND=close, OMP_PLACES=cores)")
        return None

    def launch_environment(self, ctx: Context, env: Mapping[str, str]) -> tuple[dict[str, str], str]:
        added = self.target(ctx)
        return added, " ".join(f"{k}={v}" for k, v in added.items()) + (
            f" (this process runs {torch.get_num_threads()} threads on {ctx.topology.physical_cores} "
            "physical cores, unpinned)" if not os.environ.get("OMP_PROC_BIND") else "")


RECIPE = Threads()

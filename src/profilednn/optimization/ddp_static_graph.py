"""``ddp_static_graph``: ``DistributedDataParallel(model, ..., static_graph=True)``.

Told that every iteration uses the same parameters through the same graph, DDP learns
which parameters are used from the first iteration and stops rediscovering it: with
``find_unused_parameters=True`` it no longer walks the autograd graph from the outputs
every iteration (the largest saving), and the reducer skips its per-iteration bookkeeping
of ready and unused parameters. The same sums into the same buffers: judged by the
environment gate (the same losses as the arm).

Not tried where the script finds unused parameters and some had no gradient at its first
step: which parameters go unused may then change between iterations, and a static graph
would hold DDP to the first iteration's.
"""

from __future__ import annotations

from .ddp_recipe import DdpArgumentRecipe
from .script_facts import DdpFacts


def varying_graph(model: DdpFacts) -> bool:
    """The script finds unused parameters and some had no gradient at its first step."""
    return bool(model.find_unused_parameters) and model.unused_parameters > 0


class DdpStaticGraph(DdpArgumentRecipe):
    name = "ddp_static_graph"
    summary = ("DDP told the graph is static: the used parameters learnt once, not rediscovered every iteration "
               "(with find_unused_parameters=True: no walk of the autograd graph each step)")
    changes_arithmetic = False
    argument = "static_graph"

    def why_not(self, candidates: list[DdpFacts]) -> str | None:
        if not all(varying_graph(m) for m in candidates):
            return None
        unused = sum(m.unused_parameters for m in candidates)
        return (f"the script finds unused parameters (find_unused_parameters=True) and {unused} had no gradient "
                "at its first step: which go unused may change between iterations, not a static graph")


RECIPE = DdpStaticGraph()

"""A stopped ``optimize`` keeps what it measured.

Optimizing a large model takes many minutes, and a scheduler's time limit, ``timeout`` or
Ctrl-C can end it before the final A/B. :class:`ResultLog` writes the Run's
``optimize_recipes`` and ``optimize_samples`` tables each time a recipe is decided (each
write atomic, so even a hard kill leaves the last whole version) and how far the search got
(``manifest["optimize_progress"]``); :func:`progress_note` is the line ``report`` prints for
a Run that did not complete, above the recipes it did measure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..interrupts import deferred_interrupts
from ..tables import OPTIMIZE_RECIPES, OPTIMIZE_SAMPLES
from .recipes import Recipe, select_recipes
from .results import RecipeResult, recipes_table, samples_table

if TYPE_CHECKING:
    from ..run import Run

OnResults = Callable[[Sequence[RecipeResult]], None]
"""Called with every result so far, each time a recipe is decided or decided again."""

PROGRESS_KEY = "optimize_progress"


class ResultLog:
    """Keeps a Run's recipe tables current while the search runs (an :data:`OnResults`)."""

    def __init__(self, run: "Run", recipes: "list[str | Recipe] | str | None") -> None:
        """``recipes`` as the search takes them (names, ``Recipe`` objects, None for all)."""
        self.run, self.planned = run, [r.name for r in select_recipes(recipes)]

    def __call__(self, results: Sequence[RecipeResult]) -> None:
        """Write the tables and the progress as one step: a SIGTERM or Ctrl-C that arrives
        between them waits until all three are written, so an interrupted Run never holds a
        decided recipe its manifest does not count (and ``report`` would not mention)."""
        with deferred_interrupts():
            self.run.write_table(OPTIMIZE_RECIPES, recipes_table(results))
            self.run.write_table(OPTIMIZE_SAMPLES, samples_table(results))
            self.run.update(**{PROGRESS_KEY: {"decided": [r.recipe for r in results], "planned": self.planned}})


def progress_note(manifest: Mapping[str, Any]) -> str | None:
    """How far the search of an optimize Run that did not complete got; None for a
    complete Run or one that decided no recipe."""
    progress = manifest.get(PROGRESS_KEY) or {}
    status = manifest.get("status")
    if status == "complete" or not progress.get("decided"):
        return None
    decided, planned = list(progress["decided"]), list(progress.get("planned") or [])
    untried = [name for name in planned if name not in decided]
    return (f"this optimize ended {status} after {len(decided)} of {len(planned) or len(decided)} recipes"
            + (f" ({', '.join(untried)} not decided)" if untried else "")
            + ", before its final stock vs optimized A/B: the recipes below are what it measured; "
            "each kept its own A/B and numerics verdict")


__all__ = ["OnResults", "PROGRESS_KEY", "ResultLog", "progress_note"]

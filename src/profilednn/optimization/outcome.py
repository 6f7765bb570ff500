"""An optimize Run's outcome, written the same way for every arm kind.

``optimize_recipes`` (one row per recipe), ``optimize_samples`` (every timed sample),
``optimize_headroom`` (the optimized step by op family, when measured), ``steps`` (the
optimized arm's timed steps from the final A/B) and the summary under
``manifest["optimize"]``; ``profilednn report RUN`` shows them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..tables import OPTIMIZE_HEADROOM, OPTIMIZE_RECIPES, OPTIMIZE_SAMPLES, STEPS, steps_frame
from .results import OptimizeReport

if TYPE_CHECKING:
    from ..run import Run


def write_outcome(run: "Run", report: OptimizeReport, *, notes: list[str] | None = None, **manifest: Any) -> None:
    """Write ``report``'s tables into ``run`` and mark it complete, its summary under
    ``manifest["optimize"]``. ``notes``: the Run's notes (default: the report's);
    ``manifest``: more top-level manifest keys."""
    run.write_table(OPTIMIZE_RECIPES, report.table())
    run.write_table(OPTIMIZE_SAMPLES, report.samples())
    if report.headroom is not None:
        run.write_table(OPTIMIZE_HEADROOM, report.headroom.table())
    times = list(report.final.samples_ms) if report.final is not None else []
    if times:
        run.write_table(STEPS, steps_frame([{"step": i, "time_ms": ms} for i, ms in enumerate(times)]))
    run.set_status("complete", optimize=report.to_dict(), steps=len(times),
                   notes=list(report.notes if notes is None else notes), **manifest)


__all__ = ["write_outcome"]

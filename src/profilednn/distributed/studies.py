"""The common ending of the distributed studies (scale, convergence): the study's table and
its chart go into the Run, which is then marked complete."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import polars as pl

from ..run import Run
from ..tables import Table

if TYPE_CHECKING:  # matplotlib only when a chart is drawn
    from ..render.charts import Chart


def complete_study(run: Run, name: Table, table: pl.DataFrame, chart: "Chart | None", **status: Any) -> None:
    """Write ``table`` as the Run's table ``name``, ``chart`` (when there is one) as
    ``<name>.png``, and mark the Run complete with ``status``."""
    run.write_table(name, table)
    if chart is not None:
        chart.save_png(run.path / f"{name}.png")
    run.set_status("complete", **status)


__all__ = ["complete_study"]

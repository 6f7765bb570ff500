"""The profile's charts in a Run's report (and the comparison of two Runs): one function
a chart, each taking an analysis table and returning a :class:`Chart` (``None`` when the
table is empty), drawn with ``render.charts``' building blocks.
"""

from __future__ import annotations

import polars as pl

from ..render.charts import PALETTE, Chart, chart_axes, chart_figure, chart_subplots, short_label

DIRECTION_COLORS = {
    "FWD_B": "#4C78A8", "FWD_D": "#6F9BD1", "FWD_I": "#9ECAE9",
    "BWD_D": "#F58518", "BWD_W": "#E45756", "BWD_WB": "#B279A2", "BWD_DW": "#FF9DA6",
    "n/a": "#BAB0AC",
}
PHASE_COLORS = {
    "data": "#BAB0AC", "forward": "#4C78A8", "loss": "#E45756", "backward": "#F58518",
    "optimizer": "#54A24B", "other": "#9D755D", "unattributed": "#DDDDDD",
}
COVERAGE_COLORS = {"onednn": "#4C78A8", "aten": "#F58518", "overhead": "#BAB0AC", "unattributed": "#DDDDDD"}


# ------------------------------------------------------------------------- one Run
def driver_direction_chart(df: pl.DataFrame, title: str = "oneDNN time by driver and direction") -> Chart | None:
    """Stacked bars, one per driver, one segment per direction (seed 000, Fig 2)."""
    if df.height == 0:
        return None
    d = df.with_columns(pl.col("direction").fill_null("n/a"))
    drivers = (
        d.group_by("driver").agg(ms=pl.col("ms_per_step").sum()).sort("ms")["driver"].to_list()
    )
    directions = sorted(d["direction"].unique().to_list())
    fig = chart_figure(7.5, 0.45 * len(drivers) + 1.4)
    ax = chart_axes(fig)
    left = [0.0] * len(drivers)
    for i, direction in enumerate(directions):
        sub = dict(zip(*d.filter(pl.col("direction") == direction).select("driver", "ms_per_step").to_dict(as_series=False).values()))
        widths = [float(sub.get(drv, 0.0)) for drv in drivers]
        ax.barh(drivers, widths, left=left, label=direction,
                color=DIRECTION_COLORS.get(direction, PALETTE[i % len(PALETTE)]))
        left = [a + b for a, b in zip(left, widths)]
    ax.set_xlabel("ms per step")
    ax.set_title(title, loc="left")
    ax.legend(loc="lower right", fontsize=8, frameon=False)
    return Chart("driver_direction", title, fig)


def phase_coverage_chart(phases: pl.DataFrame | None, coverage: pl.DataFrame | None) -> Chart | None:
    """The step as stacked bars: by phase, and by what accounts for the time."""
    rows = []
    if phases is not None and phases.height:
        rows.append(("by phase", [(r["phase"], r["ms_per_step"], r["share_pct"], PHASE_COLORS.get(r["phase"], "#999"))
                                  for r in phases.iter_rows(named=True)]))
    if coverage is not None and coverage.height:
        rows.append(("by source", [(r["label"], r["ms_per_step"], r["share_pct"], COVERAGE_COLORS.get(r["component"], "#999"))
                                   for r in coverage.iter_rows(named=True)]))
    if not rows:
        return None
    fig = chart_figure(8.5, 1.25 * len(rows) + 0.6)
    axes = chart_subplots(fig, len(rows), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (name, segments) in zip(axes, rows):
        left = 0.0
        for label, width, share, color in segments:
            if not width or width <= 0:
                continue
            ax.barh([0], [width], left=left, color=color, edgecolor="white", linewidth=0.5,
                    label=f"{label}: {width:,.2f} ms ({share:.0f}%)")
            left += width
        ax.set_yticks([0], [name])
        ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=7.5, frameon=False)
    axes[-1].set_xlabel("ms per step")
    axes[0].set_title("Where a step goes", loc="left")
    return Chart("step", "Where a step goes", fig)


def top_ops_chart(by_op: pl.DataFrame, n: int = 15) -> Chart | None:
    """Framework ops by self time per step, split into oneDNN, native and overhead."""
    if by_op.height == 0:
        return None
    top = by_op.head(n).reverse()
    labels = [short_label(x) for x in top["op"].to_list()]
    fig = chart_figure(7.5, 0.32 * top.height + 1.3)
    ax = chart_axes(fig)
    left = [0.0] * top.height
    for column, label, color in (
        ("onednn_ms", "oneDNN", COVERAGE_COLORS["onednn"]),
        ("native_ms", "native ATen", COVERAGE_COLORS["aten"]),
        ("overhead_ms", "framework overhead", COVERAGE_COLORS["overhead"]),
    ):
        # per-step width: the column's total scaled like self_ms -> ms_per_step
        widths = [
            float(v) * float(per_step) / float(total) if total else 0.0
            for v, per_step, total in zip(top[column].to_list(), top["ms_per_step"].to_list(), top["self_ms"].to_list())
        ]
        ax.barh(labels, widths, left=left, color=color, label=label)
        left = [a + b for a, b in zip(left, widths)]
    ax.set_xlabel("self time, ms per step")
    ax.set_title(f"Top {top.height} framework ops", loc="left")
    ax.legend(loc="lower right", fontsize=8, frameon=False)
    return Chart("top_ops", f"Top {top.height} framework ops", fig)


def layer_fwd_bwd_chart(per_layer: pl.DataFrame, n: int = 15) -> Chart | None:
    """Forward and backward time of the heaviest leaf modules (seed 001's layer view)."""
    if per_layer.height == 0:
        return None
    top = per_layer.head(n).reverse()
    labels = [short_label(f"{m} ({t})" if t else m) for m, t in zip(top["module"].to_list(), top["module_type"].to_list())]
    fig = chart_figure(7.5, 0.34 * top.height + 1.3)
    ax = chart_axes(fig)
    y = list(range(top.height))
    ax.barh([v + 0.2 for v in y], top["forward_ms"].to_list(), height=0.4, label="forward", color=PHASE_COLORS["forward"])
    ax.barh([v - 0.2 for v in y], top["backward_ms"].to_list(), height=0.4, label="backward", color=PHASE_COLORS["backward"])
    ax.set_yticks(y, labels)
    ax.set_xlabel("ms per step")
    ax.set_title("Forward and backward time per layer", loc="left")
    ax.legend(loc="lower right", fontsize=8, frameon=False)
    return Chart("layers_fwd_bwd", "Forward and backward time per layer", fig)


# ------------------------------------------------------------------------- comparison
def ratio_chart(table: pl.DataFrame, keys: list[str], name: str, title: str, n: int = 15) -> Chart | None:
    """A vs B per step (left) and the B/A ratio (right) for the rows that changed most
    (seed 000, Fig 4)."""
    if table.height == 0:
        return None
    top = table.head(n).reverse()
    labels = [short_label(" ".join(str(v) for v in vals)) for vals in zip(*[top[k].to_list() for k in keys])]
    fig = chart_figure(9.0, 0.34 * top.height + 1.5)
    ax1, ax2 = chart_subplots(fig, 1, 2, sharey=True, gridspec_kw={"width_ratios": [3, 2]})
    y = list(range(top.height))
    ax1.barh([v + 0.2 for v in y], top["a_ms"].to_list(), height=0.4, label="A (reference)", color="#9ECAE9")
    ax1.barh([v - 0.2 for v in y], top["b_ms"].to_list(), height=0.4, label="B", color="#4C78A8")
    ax1.set_yticks(y, labels)
    ax1.set_xlabel("ms per step")
    ax1.legend(loc="lower right", fontsize=8, frameon=False)
    ratios = [float(r) if r is not None and r > 0 else float("nan") for r in top["ratio"].to_list()]
    finite = [r for r in ratios if r == r]
    # bars grow from 1.0: right = B slower, left = B faster; log scale for wide ranges
    colors = ["#E45756" if r > 1.0 else "#54A24B" for r in (x if x == x else 1.0 for x in ratios)]
    ax2.barh(y, [(r - 1.0) if r == r else 0.0 for r in ratios], left=1.0, color=colors)
    if finite and max(finite) / min(finite) > 8:
        ax2.set_xscale("log", base=2)
    ax2.axvline(1.0, color="#333", linewidth=0.8)
    for yi, r, a_ms, b_ms in zip(y, ratios, top["a_ms"].to_list(), top["b_ms"].to_list()):
        text = f"{r:.2f}x" if r == r else ("only in B" if b_ms > 0 else "only in A" if a_ms > 0 else "")
        ax2.annotate(text, (r if r == r else 1.0, yi), xytext=(3, 0), textcoords="offset points",
                     va="center", fontsize=7)
    ax2.set_xlabel("B / A")
    fig.suptitle(title, x=0.01, ha="left", fontsize=10)
    return Chart(name, title, fig)

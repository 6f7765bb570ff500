"""Charts of the distributed studies (matplotlib, headless): scaling, convergence, projection."""

from __future__ import annotations

import matplotlib
import polars as pl
from matplotlib.figure import Figure

from ..render.charts import PALETTE, Chart

_RC = {"font.size": 9, "axes.spines.top": False, "axes.spines.right": False, "svg.fonttype": "none",
       "svg.hashsalt": "profilednn"}


def _fig(width: float = 6.4, height: float = 3.4) -> tuple[Figure, object]:
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(width, height), layout="constrained")
        return fig, fig.add_subplot()


def scale_chart(table: pl.DataFrame) -> Chart | None:
    """Strong: normalized throughput vs ranks, one line per threads/rank. Weak: images/s and step ms."""
    if table.height == 0:
        return None
    mode = table["mode"][0]
    fig, ax = _fig()
    with matplotlib.rc_context(_RC):
        if mode == "weak":
            t = table.sort("ranks")
            ax.plot(t["ranks"], t["items_per_s"], marker="o", color=PALETTE[0], label="items/s")
            ideal = [t["items_per_s"][0] * r / t["ranks"][0] for r in t["ranks"]]
            ax.plot(t["ranks"], ideal, ls="--", color=PALETTE[9], label="ideal")
            ax.set_ylabel("items/s")
            twin = ax.twinx()
            twin.plot(t["ranks"], t["step_ms"], marker="s", color=PALETTE[1], label="step ms")
            twin.set_ylabel("step time (ms)")
            twin.set_ylim(bottom=0)
            ax.set_title("weak scaling (local batch fixed)")
            ax.legend(loc="upper left", fontsize=8)
        else:
            for i, (threads, part) in enumerate(table.sort("ranks").group_by("threads", maintain_order=True)):
                th = threads[0] if isinstance(threads, tuple) else threads
                ax.plot(part["ranks"], part["normalized"], marker="o", color=PALETTE[i % len(PALETTE)],
                        label=f"{th} threads/rank")
            ax.set_ylabel("normalized throughput")
            ax.set_title(f"ranks x threads at global batch {table['global_batch'][0]} (Table 3)")
            ax.legend(fontsize=8)
        ax.set_xlabel("ranks")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(set(table["ranks"].to_list())), [str(r) for r in sorted(set(table["ranks"].to_list()))])
    return Chart("scale", "scaling study", fig)


def convergence_chart(table: pl.DataFrame) -> Chart | None:
    """Fig 7: epochs to the target accuracy (normalized) vs global batch."""
    reached = table.filter(pl.col("epochs_to_target").is_not_null())
    if reached.height == 0:
        return None
    fig, ax = _fig()
    with matplotlib.rc_context(_RC):
        ax.plot(reached["global_batch"], reached["convergence_ratio"], marker="o", color=PALETTE[0])
        ax.set_xscale("log", base=2)
        gb = reached["global_batch"].to_list()
        ax.set_xticks(gb, [str(g) for g in gb])
        ax.set_xlabel("global batch")
        ax.set_ylabel("epochs to target (normalized)")
        ax.set_title("convergence ratio vs global batch (Fig 7)")
        ax.set_ylim(bottom=0)
    return Chart("convergence", "epochs to target vs global batch", fig)


def projection_chart(table: pl.DataFrame) -> Chart | None:
    """Predicted throughput and scaling efficiency vs nodes."""
    if table.height == 0:
        return None
    fig, ax = _fig()
    with matplotlib.rc_context(_RC):
        ax.plot(table["nodes"], table["items_per_s"], marker="o", color=PALETTE[0], label="predicted items/s")
        ax.plot(table["nodes"], table["items_per_s"][0] * table["nodes"], ls="--", color=PALETTE[9], label="linear")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(table["nodes"].to_list(), [str(n) for n in table["nodes"]])
        ax.set_xlabel("nodes")
        ax.set_ylabel("items/s")
        twin = ax.twinx()
        twin.plot(table["nodes"], table["efficiency"] * 100, marker="s", color=PALETTE[1], label="efficiency %")
        twin.set_ylabel("scaling efficiency (%)")
        twin.set_ylim(0, 105)
        ax.legend(loc="upper left", fontsize=8)
        ax.set_title("alpha-beta projection")
    return Chart("projection", "projected throughput vs nodes", fig)


__all__ = ["convergence_chart", "projection_chart", "scale_chart"]

"""Chart building blocks: matplotlib figures (headless, no pyplot) in the reports' style,
as inline SVG or PNG.

A job's chart function draws on :func:`chart_figure` / :func:`chart_axes` and returns a
:class:`Chart` (or ``None`` when its table is empty). ``Chart.svg()`` gives markup to
inline in HTML (no XML header, no external references); ``Chart.save_png(path)`` writes
a PNG atomically.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.figure import Figure

from ..atomic import atomic_write_bytes

PALETTE = (
    "#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#EECA3B",
    "#B279A2", "#FF9DA6", "#9D755D", "#BAB0AC",
)
_RC = {
    "svg.fonttype": "none",  # text stays text: small files, selectable labels
    "svg.hashsalt": "profilednn",  # stable element ids
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
}


@dataclass
class Chart:
    """A named figure: ``name`` becomes the PNG file name, ``title`` the caption."""

    name: str
    title: str
    figure: Figure

    def _save(self, buf, **kwargs) -> None:
        with matplotlib.rc_context(_RC):
            self.figure.savefig(buf, **kwargs)
        # the first save laid the figure out; keep those positions for the next format
        self.figure.set_layout_engine("none")

    def svg(self) -> str:
        buf = io.StringIO()
        self._save(buf, format="svg", metadata={"Date": None, "Creator": None})
        text = buf.getvalue()
        text = text[text.index("<svg"):]  # drop the XML declaration and DOCTYPE
        text = re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)
        # inline SVG in HTML needs no namespace declarations (the parser adds them)
        text = re.sub(r'\sxmlns(:xlink)?="[^"]*"', "", text, count=2)
        return text.replace("<svg ", f'<svg role="img" aria-label="{self.title}" class="chart" ', 1)

    def png(self, dpi: int = 110) -> bytes:
        buf = io.BytesIO()
        self._save(buf, format="png", dpi=dpi, metadata={"Software": None})
        return buf.getvalue()

    def save_png(self, path: Path) -> Path:
        atomic_write_bytes(Path(path), self.png())
        return Path(path)


def chart_figure(width: float, height: float) -> Figure:
    """An empty figure of ``width`` x ``height`` inches in the report's style."""
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(width, height), layout="constrained")
    return fig


def chart_axes(fig: Figure):
    """The one plot area of ``fig``, in the report's style."""
    with matplotlib.rc_context(_RC):
        return fig.add_subplot()


def chart_subplots(fig: Figure, *args: Any, **kwargs: Any) -> Any:
    """``fig.subplots(*args, **kwargs)`` in the report's style (a grid of plot areas)."""
    with matplotlib.rc_context(_RC):
        return fig.subplots(*args, **kwargs)


def short_label(text: object, width: int = 42) -> str:
    """``text`` cut to ``width`` characters with an ellipsis (chart axis labels)."""
    s = str(text)
    return s if len(s) <= width else s[: width - 1] + "\u2026"


__all__ = ["PALETTE", "Chart", "chart_axes", "chart_figure", "chart_subplots", "short_label"]

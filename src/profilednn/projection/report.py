"""The projection's section of a Run's HTML report (empty when the Run was not projected)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from ..formatting import ms, pct
from ..render.charts import Chart, chart_axes, chart_figure, short_label
from ..render.html import Section, cards, esc, figure, table
from ..hardware.dtypes import format_flops, format_peaks
from ..hardware.drift import describe
from .projector import load_projection

if TYPE_CHECKING:
    from ..run import Run

PRIMITIVE_COLUMNS = ("driver", "direction", "problem", "impl", "same_impl", "calls_per_step",
                     "in_situ_ms", "replay_ms", "replay_wall_ms", "flops", "bytes", "ai",
                     "attainable_ms", "bound", "projected_ms", "note")
OP_COLUMNS = ("op", "input_shapes", "calls_per_step", "in_situ_ms", "replay_ms", "flops", "bytes",
              "attainable_ms", "bound", "projected_ms", "note")


def driver_chart(by_driver: pl.DataFrame, n: int = 12) -> Chart | None:
    """Grouped bars per driver: in situ, replayed alone, roofline (ms per step)."""
    if by_driver.is_empty():
        return None
    d = by_driver.sort("in_situ_ms", descending=True).head(n).reverse()
    names = [short_label(x, 24) for x in d["name"].to_list()]
    fig = chart_figure(7.5, 0.5 * len(names) + 1.4)
    ax = chart_axes(fig)
    ys = list(range(len(names)))
    h = 0.27
    for off, col, label, color in ((h, "in_situ_ms", "in situ", "#2e86c1"),
                                   (0.0, "projected_ms", "replayed alone", "#d68910"),
                                   (-h, "attainable_ms", "roofline", "#7f8c8d")):
        ax.barh([y + off for y in ys], d[col].fill_null(0.0).to_list(), height=h, label=label,
                color=color)
    ax.set_yticks(ys, names)
    ax.set_xlabel("ms per step")
    title = "Kernel time per driver: in situ, replayed alone, roofline"
    ax.set_title(title, loc="left")
    ax.legend(loc="lower right", fontsize=8, frameon=False)
    return Chart("projection_drivers", title, fig)


def _step_html(proj) -> list[str]:
    """The step model (step_model.py): parts with their assumptions, phases, conv calls."""
    from .step_model import by_part, by_phase

    if proj.step.is_empty():
        return []
    s = proj.summary
    out = [f"<h3>Step model: projected_step_ms {ms(s.get('projected_step_ms'))} at "
           f"{esc(s.get('threads'))} thread(s)</h3>",
           "<p>Kernel parts replayed at the target; other ops and the gaps between ops kept "
           "as measured. Means over the Run's steps.</p>",
           table(by_part(proj.step)), table(by_phase(proj.step))]
    if not proj.conv_calls.is_empty():
        out += ["<h4>Convolution calls (replayed whole: which kernel PyTorch picks)</h4>",
                table(proj.conv_calls.sort("in_situ_total_ms", descending=True),
                      ("op", "input_shapes", "calls_per_step", "in_situ_ms", "replay_ms",
                       "in_situ_path", "replay_path", "note"), max_rows=40)]
    return out


def report_sections(run: "Run") -> list[Section]:
    """The projection section for ``run``; [] when it has no projection tables."""
    proj = load_projection(run)
    if proj is None:
        return []
    s = proj.summary
    head = cards([
        ("measured step", ms(s.get("measured_step_ms"))),
        ("projected step", ms(s.get("projected_step_ms"))),
        ("projected kernels", ms(s.get("projected_kernel_ms"))),
        ("efficiency", pct(s.get("efficiency"))),
        ("roofline ceiling", ms(s.get("attainable_step_ms"))),
        ("MFU", pct(s.get("mfu"))),
        ("replay coverage", pct(s.get("coverage"))),
        ("same oneDNN impl", f"{s.get('same_impl', 0)}/{s.get('impl_checked', 0)}"),
    ])
    intro = (f"<p>Each unique primitive and compute op was replayed alone at "
             f"{esc(s.get('threads'))} thread(s) on {esc(s.get('machine'))} "
             f"(GEMM peak {format_peaks(s.get('peak_gflops_by_dtype'), s.get('gemm_peak_gflops'))}, bandwidth "
             f"{s.get('bandwidth_gbs', 0):.1f} GB/s) and weighted by its calls per step. "
             "Efficiency = projected kernel time / measured step time. MFU holds each dtype's "
             f"model FLOPs ({format_flops(s.get('flops_by_dtype'))} per step) against that dtype's GEMM peak.</p>"
             f"<p>{esc(describe(proj.machine))}</p>")
    chart = driver_chart(proj.by_driver)
    body = [head, intro, figure(chart.svg() if chart else None, chart.title if chart else ""),
            "<h3>By driver</h3>", table(proj.by_driver),
            "<h3>By phase</h3>", table(proj.by_phase),
            *_step_html(proj),
            "<h3>By layer</h3>", table(proj.by_layer, max_rows=40),
            "<h3>Primitives</h3>",
            table(proj.primitives.sort("in_situ_total_ms", descending=True), PRIMITIVE_COLUMNS,
                  max_rows=60)]
    if not proj.ops.is_empty():
        body += ["<h3>Framework ops (outside oneDNN)</h3>",
                 table(proj.ops.sort("in_situ_total_ms", descending=True), OP_COLUMNS, max_rows=40)]
    body.append("<h3>Assumptions</h3><ul>" + "".join(f"<li>{esc(a)}</li>" for a in proj.assumptions)
                + "</ul>")
    return [Section("Projection", "".join(body), id="projection")]


__all__ = ["driver_chart", "report_sections"]

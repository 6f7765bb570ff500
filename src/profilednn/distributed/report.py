"""HTML sections for a Run's report: the distributed job's tables, when the Run has them.

``report_sections(run)`` is called for every Run's report (report/job_sections.py); it
returns [] for a Run without distributed tables, and reads nothing it does not show.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..render.html import Section, cards, esc, figure, key_values, table
from ..tables import CONVERGENCE, DIST_COMM, DIST_PROJECTION, DIST_RANKS, DIST_STEPS, SCALE

if TYPE_CHECKING:
    from ..run import Run


def _notes(items) -> str:
    return "".join(f'<p class="note">{esc(n)}</p>' for n in items or [])


def _ranks_section(run: "Run") -> Section | None:
    if not run.has_table(DIST_RANKS) and not run.has_table(DIST_STEPS):
        return None
    d = run.manifest.get("distributed") or {}
    merged = run.manifest.get("merged") or {}
    parts = [cards([
        ("rank", f"{d.get('rank', '?')} of {d.get('world_size', '?')}"),
        ("batch (local / global)", f"{d.get('local_batch', '?')} / {d.get('global_batch', '?')}"),
        ("threads, cpus", f"{d.get('threads', '?')} on {d.get('cpus', '?')}"),
        ("backend", str(d.get("backend") or "none (one process)")),
        ("attempt", f"{d.get('attempt', 0)} (started at step {d.get('start_step', 0)})"),
    ] + ([("job step (slowest rank)", f"{merged['step_ms']:.1f} ms")] if merged.get("step_ms") else [])
      + ([("throughput", f"{merged['items_per_s']:.1f} items/s")] if merged.get("items_per_s") else []))]
    if run.has_table(DIST_RANKS):
        parts.append("<h3>Merged view: compute vs communication per rank</h3>")
        parts.append(table(run.table(DIST_RANKS), headers={"exposed_comm_ms": "exposed comm ms",
                                                             "comm_share": "exposed share",
                                                             "slowdown": "compute vs median"}))
        if merged.get("stragglers"):
            parts.append(_notes([f"stragglers: ranks {', '.join(map(str, merged['stragglers']))} compute more "
                                 "than 10 % longer than the median rank; every other rank waits for them at "
                                 "each allreduce"]))
        parts.append('<p class="more">medians per step after warm-up; allreduce = time a gradient bucket '
                     "spent in the backend; exposed = the part not hidden under backward compute.</p>")
    if run.has_table(DIST_STEPS):
        steps = run.table(DIST_STEPS)
        parts.append("<h3>This rank's steps</h3>")
        parts.append(table(steps.drop("rank"), max_rows=50))
    return Section("Distributed training", "".join(parts), id="distributed")


def _comm_section(run: "Run") -> Section | None:
    if not run.has_table(DIST_COMM):
        return None
    ab = run.manifest.get("alpha_beta") or {}
    body = [key_values([("alpha (latency per message)", f"{ab.get('alpha_s', 0) * 1e6:.1f} µs"),
                        ("bandwidth (1/beta)", f"{ab.get('bandwidth_gbps', 0):.2f} GB/s"),
                        ("ranks", ab.get("ranks"))]),
            table(run.table(DIST_COMM))]
    return Section("Allreduce cost (alpha-beta)", "".join(body), id="distributed-comm")


def _projection_section(run: "Run") -> Section | None:
    if not run.has_table(DIST_PROJECTION):
        return None
    from .charts import projection_chart

    t = run.table(DIST_PROJECTION)
    info = run.manifest.get("projection") or {}
    chart = projection_chart(t)
    body = [figure(chart.svg() if chart else None, "predicted throughput and efficiency"), table(t),
            "<h3>Assumptions</h3><ul>" + "".join(f"<li>{esc(a)}</li>" for a in info.get("assumptions") or []) + "</ul>",
            _notes(info.get("notes"))]
    return Section("Projection to more nodes", "".join(body), id="distributed-projection")


def _scale_section(run: "Run") -> Section | None:
    if not run.has_table(SCALE):
        return None
    from .charts import scale_chart

    t = run.table(SCALE)
    chart = scale_chart(t)
    body = [figure(chart.svg() if chart else None, "scaling study")]
    if t["mode"][0] == "strong":
        pivot = t.sort(["threads", "ranks"]).pivot(on="ranks", index="threads", values="normalized", sort_columns=True)
        body.append("<h3>Normalized throughput (rows: threads per rank, columns: ranks)</h3>")
        body.append(table(pivot.rename({c: f"{c} ranks" for c in pivot.columns if c != "threads"})))
    body.append(table(t))
    body.append(_notes(run.manifest.get("notes")))
    return Section("Scaling study", "".join(body), id="distributed-scale")


def _convergence_section(run: "Run") -> Section | None:
    if not run.has_table(CONVERGENCE):
        return None
    from .charts import convergence_chart

    t = run.table(CONVERGENCE)
    chart = convergence_chart(t)
    body = [figure(chart.svg() if chart else None, "epochs to target vs global batch"), table(t),
            _notes(run.manifest.get("advice"))]
    return Section("Convergence vs global batch", "".join(body), id="distributed-convergence")


def report_sections(run: "Run") -> list[Section]:
    """The distributed sections this Run has tables for (possibly none)."""
    out = []
    for build in (_ranks_section, _comm_section, _projection_section, _scale_section, _convergence_section):
        section = build(run)
        if section is not None:
            out.append(section)
    return out


__all__ = ["report_sections"]

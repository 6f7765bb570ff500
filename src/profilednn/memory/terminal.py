"""The memory job's terminal printer: the tables of ``profilednn memory``.

(``report.py`` beside it holds the job's HTML section.) Below
:data:`~profilednn.formatting.FULL_TABLE_WIDTH` columns the per-layer table drops the
layer type and the workspace column, the trade-off table the saved and offloaded bytes;
``wide=True`` (``--wide``) shows them anyway.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from ..formatting import full_tables, print_table, styled
from ..tables import MEMORY_LAYERS, MEMORY_SUMMARY, MEMORY_TRADEOFF, PIPELINE_STAGES, PIPELINE_STEPS
from .units import format_bytes

if TYPE_CHECKING:
    from rich.console import Console

    from ..run import Run
    from .pipeline.runner import PipelineResult

LAYER_COLUMNS = (("layer", "module"), ("type", "module_type"), ("weights", "params_bytes"),
                 ("grads", "grad_bytes"), ("optim state", "optimizer_state_bytes"),
                 ("saved pred.", "saved_predicted_bytes"), ("saved meas.", "saved_measured_bytes"),
                 ("workspace", "workspace_bytes"))
WIDE_ONLY = ("type", "workspace")


def print_memory(run: Run, console: Console, top: int = 20, *, wide: bool = False) -> None:
    """Memory per layer, predicted vs measured, RSS, the budget's batch, the trade-off, notes."""
    mem = run.manifest.get("memory") or {}
    layers = run.table(MEMORY_LAYERS).sort("saved_measured_bytes", descending=True)
    table = Table(title=f"{mem.get('workload', '')} batch {mem.get('batch_size', '')} on {mem.get('device', '')}: "
                        f"memory per layer (largest saved activations first)", title_justify="left")
    full = full_tables(console, wide)
    cols = [(label, c) for label, c in LAYER_COLUMNS if full or label not in WIDE_ONLY]
    for label, _ in cols:
        table.add_column(label, justify="left" if label in ("layer", "type") else "right",
                         overflow="fold")
    for r in layers.head(top).iter_rows(named=True):
        table.add_row(*[str(r[c]) if c in ("module", "module_type") else format_bytes(r[c]) for _, c in cols])
    if layers.height > top:
        rest = layers.slice(top)
        table.add_row(f"... {rest.height} more", *["" if c == "module_type" else format_bytes(rest[c].sum())
                                                   for _, c in cols[1:]])
    print_table(console, table, wide=wide)
    summary = run.table(MEMORY_SUMMARY)
    st = Table(title="predicted vs measured", title_justify="left")
    for c in ("quantity", "predicted", "measured", "error"):
        st.add_column(c, justify="left" if c == "quantity" else "right")
    for r in summary.iter_rows(named=True):
        p, m = r["predicted_bytes"], r["measured_bytes"]
        err = f"{(p / m - 1) * 100:+.1f}%" if m else ""
        st.add_row(r["quantity"], format_bytes(p), format_bytes(m), err)
    console.print(st)
    console.print(f"RSS: {format_bytes(mem.get('rss_start_bytes'))} at start, {format_bytes(mem.get('rss_peak_bytes'))} peak "
                  "(process resident memory; includes the allocator's cache)", highlight=False)
    budget = mem.get("budget")
    if budget:
        confirmed = budget.get("confirmed_batch")
        console.print(f"budget {format_bytes(budget['budget_bytes'])}: predicted batch {budget['predicted_batch']} "
                      f"(fixed {format_bytes(budget['fixed_bytes'])} + {format_bytes(budget['bytes_per_item'])} per item); "
                      + (f"confirmed batch {confirmed} by a run" if confirmed is not None else "not confirmed"),
                      highlight=False)
    if run.has_table(MEMORY_TRADEOFF):
        _print_tradeoff(run, console, wide)
    for note in mem.get("notes") or []:
        console.print(styled("note:", "yellow", f" {note}"))


TRADEOFF_COLUMNS = ("config", "checkpoint", "saved on device", "offloaded", "peak", "peak/none", "step ms",
                    "slowdown")
TRADEOFF_WIDE_ONLY = ("saved on device", "offloaded")


def _print_tradeoff(run: Run, console: Console, wide: bool) -> None:
    tr = run.table(MEMORY_TRADEOFF)
    tt = Table(title="memory vs step time", title_justify="left")
    full = full_tables(console, wide)
    columns = [c for c in TRADEOFF_COLUMNS if full or c not in TRADEOFF_WIDE_ONLY]
    for c in columns:  # the checkpoint policy wraps in a narrow terminal; numbers and headers never
        text = c in ("config", "checkpoint")
        tt.add_column(c, justify="left" if text else "right", overflow="fold", no_wrap=not text)
    for r in tr.iter_rows(named=True):
        cells = {"config": r["config"], "checkpoint": r["checkpoint_policy"],
                 "saved on device": format_bytes(r["saved_device_bytes"]),
                 "offloaded": format_bytes(r["offloaded_bytes"]), "peak": format_bytes(r["peak_bytes"]),
                 "peak/none": f"{r['peak_vs_none']:.2f}", "step ms": f"{r['step_ms']:.1f}",
                 "slowdown": f"{r['slowdown_vs_none']:.2f}x"}
        tt.add_row(*(cells[c] for c in columns))
    print_table(console, tt, wide=wide)
    if tr["device"][0] == "cpu":
        console.print(styled("note:", "yellow", " on a CPU the host is the device: offloading copies "
                             "without lowering the peak; it pays off on an accelerator."))


PIPELINE_COLUMNS = ("stage", "device", "layers", "weights", "act./micro-batch", "predicted ms", "busy ms/step",
                    "in flight", "weight versions")
PIPELINE_WIDE_ONLY = ("predicted ms", "in flight", "weight versions")


def print_pipeline(result: PipelineResult, title: str, console: Console, *, wide: bool = False) -> None:
    """One row per stage (layers, weights, activations, busy time), then the training result."""
    s = result.summary
    table = Table(title=f"{title} (balance {s['balance']}, {s['balance_source']})", title_justify="left")
    full = full_tables(console, wide)
    columns = [c for c in PIPELINE_COLUMNS if full or c not in PIPELINE_WIDE_ONLY]
    for c in columns:  # the layer range folds in a narrow terminal; numbers and their headers never
        text = c in ("device", "layers")
        table.add_column(c, justify="left" if text else "right", overflow="fold", no_wrap=not text)
    for r in result.stages.iter_rows(named=True):
        cells = {
            "stage": str(r["stage"]), "device": r["device"],
            "layers": f"{r['first_layer']} .. {r['last_layer']} ({r['layers']})",
            "weights": format_bytes(r["params_bytes"]),
            "act./micro-batch": format_bytes(r["activation_bytes_per_microbatch"]),
            "predicted ms": f"{r['predicted_ms']:.2f}",
            "busy ms/step": "" if r["busy_ms"] is None else f"{r['busy_ms']:.1f}",
            "in flight": "" if r["max_in_flight"] is None else str(r["max_in_flight"]),
            "weight versions": "" if r["max_weight_versions"] is None else str(r["max_weight_versions"]),
        }
        table.add_row(*(cells[c] for c in columns))
    print_table(console, table, wide=wide)
    line = f"{s['steps']} steps, median {s['median_step_ms']:.1f} ms/step, final loss {s['final_loss']:.4f}"
    if "accuracy" in s:
        line += f"; test accuracy {s['accuracy'] * 100:.1f}%"
        if "reference_accuracy" in s:
            line += f" (plain training: {s['reference_accuracy'] * 100:.1f}%)"
        if "averaged_accuracy" in s:
            line += f"; averaged weights {s['averaged_accuracy'] * 100:.1f}%"
    console.print(line, highlight=False)


def pipeline_title(model: str, summary: dict) -> str:
    """The pipeline table's title: model, schedule, stage devices, micro-batches."""
    return (f"{model}: {summary.get('schedule')} over {', '.join(summary.get('devices') or [])}, "
            f"{summary.get('microbatches')} micro-batches")


def print_run_sections(run: Run, console: Console, *, wide: bool = False) -> bool:
    """A Run's memory or pipeline tables as ``memory`` / ``pipeline`` printed them (for
    ``report``); False when it has neither."""
    printed = False
    if run.has_table(MEMORY_LAYERS) and run.has_table(MEMORY_SUMMARY):
        print_memory(run, console, wide=wide)
        printed = True
    if run.has_table(PIPELINE_STAGES):
        from .pipeline.runner import PipelineResult

        summary = dict(run.manifest.get("pipeline") or {})
        steps = run.table(PIPELINE_STEPS) if run.has_table(PIPELINE_STEPS) else PIPELINE_STEPS.empty()
        result = PipelineResult(run.table(PIPELINE_STAGES), steps, summary, run)
        print_pipeline(result, pipeline_title(str((run.manifest.get("workload") or {}).get("name", "")), summary),
                       console, wide=wide)
        printed = True
    return printed


__all__ = ["pipeline_title", "print_memory", "print_pipeline", "print_run_sections"]

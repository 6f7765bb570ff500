"""The memory job's sections of a Run's HTML report (``report_sections``), and the shared
byte formatting of its tables."""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from ..render.html import Section, cards, esc, table
from ..tables import (
    MEMORY_BUDGET,
    MEMORY_LAYERS,
    MEMORY_SUMMARY,
    MEMORY_TRADEOFF,
    PIPELINE_STAGES,
    PIPELINE_STEPS,
    tables_of,
)
from .units import format_bytes

if TYPE_CHECKING:
    from ..run import Run

MEMORY_TABLES = ("memory_layers", "memory_summary", "memory_budget", "memory_tradeoff")
PIPELINE_TABLES = tuple(t.name for t in tables_of("pipeline"))


def _mib(df: pl.DataFrame) -> pl.DataFrame:
    """Every ``*_bytes`` column as MiB (float), renamed ``*_mib``, for display."""
    return df.with_columns(
        [(pl.col(c) / 2**20).alias(c.removesuffix("_bytes") + "_mib") for c in df.columns if c.endswith("_bytes")]
    ).drop([c for c in df.columns if c.endswith("_bytes")])


def _memory_section(run: "Run") -> Section:
    mem = dict(run.manifest.get("memory") or {})
    parts: list[str] = []
    if mem:
        items = [
            ("device", str(mem.get("device", ""))),
            ("batch", str(mem.get("batch_size", ""))),
            ("saved activations (measured)", format_bytes(mem.get("saved_measured_bytes"))),
            ("saved activations (predicted)", format_bytes(mem.get("saved_predicted_bytes"))),
            ("peak (measured)", format_bytes(mem.get("measured_peak_bytes"))),
            ("peak (predicted)", format_bytes(mem.get("predicted_peak_bytes"))),
        ]
        budget = mem.get("budget") or {}
        if budget:
            confirmed = budget.get("confirmed_batch")
            items.append((f"batch for {format_bytes(budget.get('budget_bytes'))}",
                          f"{confirmed if confirmed is not None else budget.get('predicted_batch')}"
                          + (" (confirmed)" if confirmed is not None else " (predicted)")))
        parts.append(cards(items))
        for note in mem.get("notes") or []:
            parts.append(f'<div class="note">{esc(note)}</div>')
    if run.has_table(MEMORY_SUMMARY):
        parts.append("<h3>Predicted vs measured</h3>")
        parts.append(table(_mib(run.table(MEMORY_SUMMARY))))
    if run.has_table(MEMORY_TRADEOFF):
        parts.append("<h3>Memory vs step time</h3><p>Saved activations left on the device and the "
                     "step's peak for no change, offloading, checkpointing and both; on a CPU the host "
                     "is the device, so offloading cannot lower the peak there.</p>")
        parts.append(table(_mib(run.table(MEMORY_TRADEOFF))))
    if run.has_table(MEMORY_BUDGET):
        parts.append("<h3>Largest batch for the budget</h3>")
        parts.append(table(_mib(run.table(MEMORY_BUDGET))))
    if run.has_table(MEMORY_LAYERS):
        layers = run.table(MEMORY_LAYERS).sort("saved_measured_bytes", descending=True)
        parts.append("<h3>Per layer</h3>")
        parts.append(table(_mib(layers), max_rows=60))
    return Section("Memory", "".join(parts), id="memory")


def _pipeline_section(run: "Run") -> Section:
    pipe = dict(run.manifest.get("pipeline") or {})
    parts: list[str] = []
    if pipe:
        items = [("schedule", str(pipe.get("schedule", ""))), ("stages", ", ".join(pipe.get("devices") or [])),
                 ("micro-batches", str(pipe.get("microbatches", "")))]
        for key, label in (("accuracy", "test accuracy"), ("reference_accuracy", "plain training accuracy")):
            if pipe.get(key) is not None:
                items.append((label, f"{pipe[key] * 100:.1f}%"))
        parts.append(cards(items))
    if run.has_table(PIPELINE_STAGES):
        parts.append("<h3>Stages</h3>")
        parts.append(table(_mib(run.table(PIPELINE_STAGES))))
    if run.has_table(PIPELINE_STEPS):
        parts.append("<h3>Steps</h3>")
        parts.append(table(run.table(PIPELINE_STEPS), max_rows=50))
    return Section("Pipeline", "".join(parts), id="pipeline")


def report_sections(run: "Run") -> list[Section]:
    """The memory and pipeline sections for ``run``; [] when it has none of their tables."""
    tables = set(run.tables())
    sections: list[Section] = []
    if tables & set(MEMORY_TABLES):
        sections.append(_memory_section(run))
    if tables & set(PIPELINE_TABLES):
        sections.append(_pipeline_section(run))
    return sections


__all__ = ["MEMORY_TABLES", "PIPELINE_TABLES", "report_sections"]

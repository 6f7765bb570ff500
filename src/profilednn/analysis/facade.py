"""``Analysis``: one object per Run (or log) whose methods delegate to the analyzers.

Loads each table once, limited to measured steps, checks the columns the analyzers
need, and hands the tables to the pure functions in ``breakdown``, ``fragmentation``,
``advice`` and ``compare``. Tables a source lacks are ``None``; a method that needs one
raises :class:`~profilednn.errors.RunError` saying which and why.

``Analysis`` implements ``view.RunBreakdowns`` (a ``view.RunView`` with breakdowns): the
advice rules and the comparison read a Run through that interface, so they import no
facade and the facade alone imports the rule list.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any

import polars as pl

from .. import step_summary
from ..errors import RunError
from ..tables import CAPTURE_TABLES, LAYER_REFERENCE, LAYERS, OPS, OP_EVENTS, PRIMITIVES, SPANS, STEPS
from . import breakdown, fragmentation
from .compare import Comparison
from .rulebook import Advice, Rule
from .rules import rank_advice
from .source import LogSource, Source, open_source

# Columns an analyzer cannot do without, per table (the catalogue's ``required``); other
# catalogued columns are added as nulls when a producer left them out, so older or partial
# Runs still load.
REQUIRED: dict[str, tuple[str, ...]] = {t.name: t.required for t in CAPTURE_TABLES}
OPTIONAL: dict[str, dict[str, pl.DataType]] = {
    t.name: {c: dtype for c, dtype in (t.schema or {}).items() if c not in t.required} for t in CAPTURE_TABLES
}


def _normalise(name: str, df: pl.DataFrame, where: str) -> pl.DataFrame:
    missing = [c for c in REQUIRED[name] if c not in df.columns]
    if missing:
        raise RunError(f"{where}: table {name!r} lacks column(s) {', '.join(missing)}")
    add = [pl.lit(None, dtype).alias(c) for c, dtype in OPTIONAL[name].items() if c not in df.columns]
    if add:
        df = df.with_columns(add)
    if name == PRIMITIVES.name and "event" in df.columns:
        df = df.filter(pl.col("event").is_null() | (pl.col("event") == "exec"))
    # rows outside measured steps (warm-up) carry no step; keep measured steps only
    if name != STEPS.name and df.height and df["step"].drop_nulls().len():
        df = df.filter(pl.col("step").is_not_null())
    if "time_ms" in df.columns:
        df = df.with_columns(pl.col("time_ms").cast(pl.Float64).fill_null(0.0))
    return df


class Analysis:
    """Analyses of one Run or verbose log; every method returns a polars DataFrame."""

    def __init__(self, source: Source | str | Path):
        self.source: Source = open_source(source)
        self._fragments: dict[tuple[float, int], pl.DataFrame] = {}

    # -- identity --------------------------------------------------------------------
    @property
    def id(self) -> str:
        return self.source.id

    @property
    def path(self) -> Path:
        return Path(self.source.path)

    @property
    def is_log(self) -> bool:
        return isinstance(self.source, LogSource)

    @property
    def manifest(self) -> dict[str, Any]:
        return dict(self.source.manifest)

    @property
    def fingerprint(self) -> dict[str, Any]:
        return self.source.fingerprint

    @property
    def status(self) -> str:
        return self.source.status

    @property
    def workload_name(self) -> str:
        wl = self.source.workload
        return str(wl.get("name") or ("verbose log" if self.is_log else "?"))

    # -- tables ----------------------------------------------------------------------
    def _load(self, name: str) -> pl.DataFrame | None:
        if not self.source.has_table(name):
            return None
        return _normalise(name, self.source.table(name), str(self.source.path))

    @cached_property
    def primitives(self) -> pl.DataFrame | None:
        return self._load(PRIMITIVES.name)

    @cached_property
    def ops(self) -> pl.DataFrame | None:
        return self._load(OPS.name)

    @cached_property
    def op_events(self) -> pl.DataFrame | None:
        return self._load(OP_EVENTS.name)

    @cached_property
    def layers(self) -> pl.DataFrame | None:
        return self._load(LAYERS.name)

    @cached_property
    def steps(self) -> pl.DataFrame | None:
        return self._load(STEPS.name)

    @cached_property
    def spans(self) -> pl.DataFrame | None:
        return self._load(SPANS.name)

    def need(self, name: str) -> pl.DataFrame:
        """A table this analysis cannot do without; a one-line error when absent."""
        df = getattr(self, name)
        if df is None:
            why = " (a bare verbose log has primitives only)" if self.is_log else ""
            if name == OP_EVENTS.name and not self.is_log:
                why = " (captured with --light?)"
            raise RunError(f"{self.path} has no {name} table{why}")
        return df

    @cached_property
    def n_steps(self) -> int:
        """Measured steps: rows of ``steps``, else distinct steps seen, else 1 (a log)."""
        if self.steps is not None and self.steps.height:
            return self.steps.height
        for df in (self.primitives, self.ops, self.layers):
            if df is not None and "step" in df.columns and df["step"].drop_nulls().len():
                return int(df["step"].n_unique())
        return 1

    @cached_property
    def step_ms(self) -> float | None:
        """Mean measured step time (ms); ``None`` without a steps table."""
        if self.steps is None or not self.steps.height:
            return None
        return float(self.steps["time_ms"].mean())

    def step_stats(self) -> dict[str, float]:
        return step_summary.step_stats(self.steps) if self.steps is not None else {}

    # -- breakdowns ------------------------------------------------------------------
    def _prims(self) -> pl.DataFrame:
        return self.need(PRIMITIVES.name)

    def by_driver_direction(self) -> pl.DataFrame:
        return breakdown.by_driver_direction(self._prims(), self.n_steps, self.step_ms)

    def by_driver(self) -> pl.DataFrame:
        return breakdown.by_driver(self._prims(), self.n_steps, self.step_ms)

    def by_dtype_impl(self) -> pl.DataFrame:
        return breakdown.by_dtype_impl(self._prims(), self.n_steps, self.step_ms)

    def by_problem(self) -> pl.DataFrame:
        return breakdown.by_problem(self._prims(), self.n_steps, self.step_ms)

    def by_op(self) -> pl.DataFrame:
        return breakdown.by_op(self.need(OPS.name), self.n_steps, self.step_ms)

    def by_module_type(self) -> pl.DataFrame:
        return breakdown.by_module_type(self.need(OPS.name), self.n_steps, self.step_ms)

    def by_layer_phase(self) -> pl.DataFrame:
        return breakdown.by_layer_phase(self.need(LAYERS.name), self.n_steps, self.step_ms)

    def by_phase(self) -> pl.DataFrame:
        return breakdown.by_phase(self.need(STEPS.name))

    def fwd_bwd_ratio(self) -> pl.DataFrame:
        return breakdown.fwd_bwd_ratio(
            self.n_steps, steps=self.steps, layers=self.layers, prims=self.primitives, ops=self.ops
        )

    def fwd_bwd_by_layer(self) -> pl.DataFrame:
        return step_summary.fwd_bwd_by_layer(self.need(LAYERS.name), self.n_steps)

    def layer_inflation(self) -> pl.DataFrame | None:
        """Per leaf layer, the full capture's ms a step against its light reference's
        (``step_summary.layer_inflation``); None for a Run without a light reference."""
        stats = step_summary.step_stats(self.steps) if self.steps is not None else {}
        if self.layers is None or not stats or not self.source.has_table(LAYER_REFERENCE.name):
            return None
        reference = self.source.table(LAYER_REFERENCE.name)
        return step_summary.layer_inflation(self.layers, reference, stats["median_ms"])

    def loss_backward(self) -> tuple[float, str]:
        """Per-step time of the loss's backward and how it was found."""
        return breakdown.loss_backward(self.n_steps, layers=self.layers, spans=self.spans, ops=self.ops)

    def coverage(self) -> pl.DataFrame:
        return breakdown.coverage(self.n_steps, self.steps, self.primitives, self.ops)

    def coverage_by_phase(self) -> pl.DataFrame:
        return breakdown.coverage_by_phase(self.need(STEPS.name), self.primitives, self.ops, self.n_steps)

    # -- fragmentation ---------------------------------------------------------------
    def fragments(
        self,
        short_ms: float = fragmentation.DEFAULT_SHORT_MS,
        min_ops: int = fragmentation.DEFAULT_MIN_OPS,
    ) -> pl.DataFrame:
        key = (short_ms, min_ops)
        if key not in self._fragments:  # the report and the advice both ask
            self._fragments[key] = fragmentation.fragments(self.need(OP_EVENTS.name), short_ms, min_ops)
        return self._fragments[key]

    def fragmentation_summary(self) -> pl.DataFrame:
        return fragmentation.fragmentation_summary(self.fragments(), self.n_steps, self.step_ms)

    def reorders(self) -> pl.DataFrame:
        return fragmentation.reorders(self._prims(), self.n_steps, self.step_ms)

    def reorder_chains(self, min_len: int = 2) -> pl.DataFrame:
        return fragmentation.reorder_chains(self._prims(), min_len)

    # -- advice, comparison ----------------------------------------------------------
    def advice(self) -> list["Advice"]:
        return rank_advice(self)

    def compare(self, other: "Analysis | Source | str | Path") -> "Comparison":
        """This Run as the reference (A) against ``other`` (B)."""
        return Comparison(self, other if isinstance(other, Analysis) else Analysis(other))

    def __repr__(self) -> str:
        return f"Analysis({str(self.path)!r})"


def advise(source: "Analysis | object", rules: dict[str, Rule] | None = None) -> list[Advice]:
    """Every rule that fires on a Run (an Analysis, Run, log or path), ranked by
    estimated gain (largest first)."""
    analysis = source if isinstance(source, Analysis) else Analysis(source)  # type: ignore[arg-type]
    return rank_advice(analysis, rules)


def compare(a: "Analysis | object", b: "Analysis | object") -> Comparison:
    """Compare Run A (the reference) with Run B; each an Analysis, Run, log or path."""
    aa = a if isinstance(a, Analysis) else Analysis(a)  # type: ignore[arg-type]
    bb = b if isinstance(b, Analysis) else Analysis(b)  # type: ignore[arg-type]
    return Comparison(aa, bb)

"""Engine comparison (seed 001): the same workload with oneDNN on and off.

``torch.backends.mkldnn`` switched off sends convolutions (and whatever else PyTorch
would lower to oneDNN) to PyTorch's native kernels. Both captures build the workload
with the same seed, so weights and data are identical; the ratio per layer and phase
says where the optimized engine pays off (seed 001 reports up to 3.2x).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import polars as pl

from ..run import Run
from ..tables import LAYERS, PHASES, STEPS

ENGINES = ("onednn", "native")


@dataclass
class EngineComparison:
    """Step, phase and layer times with oneDNN (``onednn``) and without (``native``)."""

    by_phase: pl.DataFrame
    by_layer: pl.DataFrame
    summary: dict[str, Any]
    runs: dict[str, Path] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"summary": self.summary, "runs": {k: str(v) for k, v in self.runs.items()},
                "by_phase": self.by_phase.to_dicts(), "by_layer": self.by_layer.to_dicts()}


def _phases(run: Run) -> pl.DataFrame:
    steps = run.table(STEPS)
    cols = [f"{p}_ms" for p in PHASES if f"{p}_ms" in steps.columns]
    med = steps.select([pl.col(c).median() for c in ["time_ms", *cols]])
    rows = [{"phase": "step" if c == "time_ms" else c[:-3], "ms": float(med[c][0] or 0.0)}
            for c in ["time_ms", *cols]]
    return pl.DataFrame(rows, schema={"phase": pl.Utf8, "ms": pl.Float64})


def _layers(run: Run) -> pl.DataFrame:
    if not run.has_table(LAYERS):
        return pl.DataFrame(schema={"module": pl.Utf8, "module_type": pl.Utf8, "phase": pl.Utf8,
                                    "ms": pl.Float64})
    lay = run.table(LAYERS)
    if "leaf" in lay.columns:
        lay = lay.filter(pl.col("leaf"))
    steps = max(1, lay["step"].n_unique()) if "step" in lay.columns else 1
    return lay.group_by("module", "module_type", "phase").agg((pl.col("time_ms").sum() / steps).alias("ms"))


def _join(a: pl.DataFrame, b: pl.DataFrame, on: list[str]) -> pl.DataFrame:
    out = a.rename({"ms": "onednn_ms"}).join(b.rename({"ms": "native_ms"}), on=on, how="full",
                                              coalesce=True)
    return out.with_columns((pl.col("native_ms") / pl.col("onednn_ms")).alias("speedup"))


def compare_engines(model: str, *, runs_dir: Path | str = "runs", steps: int = 2, warmup: int = 1,
                    threads: int | None = None, light: bool = True,
                    progress: Callable[[str, int, int], None] | None = None,
                    **knobs: Any) -> EngineComparison:
    """Profile built-in workload ``model`` with oneDNN enabled, then disabled; compare.

    ``speedup`` = native time / oneDNN time (above 1: oneDNN is faster there).
    """
    import torch

    from ..capture import profile_builtin

    runs: dict[str, Run] = {}
    for engine in ENGINES:
        def step_progress(done: int, total: int, _e: str = engine) -> None:
            if progress is not None:
                progress(_e, done, total)
        before = torch.backends.mkldnn.enabled
        torch.backends.mkldnn.enabled = engine == "onednn"
        try:
            runs[engine] = profile_builtin(
                model, runs_dir, steps=steps, warmup=warmup, threads=threads, light=light,
                progress=step_progress, **knobs)
        finally:
            torch.backends.mkldnn.enabled = before
        runs[engine].update(engine=engine)
    by_phase = _join(_phases(runs["onednn"]), _phases(runs["native"]), ["phase"])
    by_layer = _join(_layers(runs["onednn"]), _layers(runs["native"]),
                     ["module", "module_type", "phase"]).sort("native_ms", descending=True,
                                                             nulls_last=True)
    step = by_phase.filter(pl.col("phase") == "step")
    summary = {
        "model": model,
        "threads": threads or runs["onednn"].fingerprint.get("threads"),
        "onednn_step_ms": float(step["onednn_ms"][0]),
        "native_step_ms": float(step["native_ms"][0]),
        "speedup": float(step["speedup"][0]),
        "assumption": "same seed, weights and data; oneDNN switched with torch.backends.mkldnn; "
                      "median over the measured steps",
    }
    return EngineComparison(by_phase, by_layer, summary, {k: r.path for k, r in runs.items()})


__all__ = ["EngineComparison", "compare_engines"]

"""A captured Run at a glance: step-time statistics from its ``steps`` table, forward /
backward time per leaf layer from its ``layers`` table, and which layers' times a full
capture inflated, against its light reference (``layer_reference``).

The capture printer shows them right after a capture (no analysis package, no torch
needed to read them) and the analysis facade builds its breakdowns on them.
"""

from __future__ import annotations

import polars as pl

from .vocabulary import PSEUDO_MODULES


def step_stats(steps: pl.DataFrame) -> dict[str, float]:
    """Median step time and its spread (min, p10, p90, max), in ms."""
    t = steps["time_ms"].drop_nulls()
    if t.len() == 0:
        return {}
    return {
        "steps": float(t.len()),
        "median_ms": float(t.median()),
        "mean_ms": float(t.mean()),
        "min_ms": float(t.min()),
        "p10_ms": float(t.quantile(0.1, interpolation="nearest")),
        "p90_ms": float(t.quantile(0.9, interpolation="nearest")),
        "max_ms": float(t.max()),
    }


def fwd_bwd_by_layer(layers: pl.DataFrame, n_steps: int) -> pl.DataFrame:
    """Forward and backward time per leaf module, with their ratio."""
    leaf = layers.filter(~pl.col("module").is_in(list(PSEUDO_MODULES)))
    if "leaf" in leaf.columns:
        leaf = leaf.filter(pl.col("leaf").fill_null(True))
    per = leaf.group_by(["module", "module_type"]).agg(
        forward_ms=pl.col("time_ms").filter(pl.col("phase") == "forward").sum() / n_steps,
        backward_ms=pl.col("time_ms").filter(pl.col("phase") == "backward").sum() / n_steps,
    )
    return per.with_columns(
        total_ms=pl.col("forward_ms") + pl.col("backward_ms"),
        bwd_fwd_ratio=pl.when(pl.col("forward_ms") > 0)
        .then(pl.col("backward_ms") / pl.col("forward_ms"))
        .otherwise(None),
    ).sort(["total_ms", "module"], descending=[True, False])


MIN_REFERENCE_STEPS = 3
"""Light reference steps needed to estimate a layer's step-to-step spread."""
MATERIAL_SHARE = 0.02
"""An excess over the light reference below this share of the step is not flagged, however clear."""


def _leaf_ms_per_step(layers: pl.DataFrame) -> tuple[int, dict[str, tuple[str | None, list[float]]]]:
    """The number of steps and, per leaf layer, its type and forward + backward ms in each step
    (0 in a step where it did not run)."""
    leaf = layers.filter(~pl.col("module").is_in(list(PSEUDO_MODULES))
                         & pl.col("phase").is_in(["forward", "backward"]))
    if "leaf" in leaf.columns:
        leaf = leaf.filter(pl.col("leaf").fill_null(True))
    if leaf.is_empty():
        return 0, {}
    n = int(leaf["step"].max()) + 1  # type: ignore[arg-type]
    per: dict[str, tuple[str | None, list[float]]] = {}
    for module, module_type, step, ms in (leaf.group_by(["module", "module_type", "step"])
                                          .agg(pl.col("time_ms").sum()).iter_rows()):
        per.setdefault(module, (module_type, [0.0] * n))[1][step] += ms
    return n, per


def _median(values: list[float]) -> float:
    return float(pl.Series(values, dtype=pl.Float64).median())  # type: ignore[arg-type]


def layer_inflation(layers: pl.DataFrame, reference: pl.DataFrame, step_ms: float) -> pl.DataFrame:
    """Per leaf layer of a full capture: its median ms a step (``full_ms``), the median and
    spread (max - min) over the light reference steps (``light_ms``, ``light_spread_ms``),
    the excess and ratio, and ``inflated``: with at least ``MIN_REFERENCE_STEPS`` light
    steps, the excess is beyond the light steps' own spread and at least ``MATERIAL_SHARE``
    of the step (``step_ms``). A layer the reference never saw has null light figures."""
    _, full = _leaf_ms_per_step(layers)
    light_steps, light = _leaf_ms_per_step(reference)
    rows = []
    for module, (module_type, samples) in full.items():
        full_ms = _median(samples)
        row = {"module": module, "module_type": module_type, "full_ms": full_ms, "light_ms": None,
               "light_spread_ms": None, "excess_ms": None, "ratio": None, "inflated": False}
        if module in light:
            ref = light[module][1]
            light_ms, spread = _median(ref), max(ref) - min(ref)
            excess = full_ms - light_ms
            row.update(light_ms=light_ms, light_spread_ms=spread, excess_ms=excess,
                       ratio=full_ms / light_ms if light_ms > 0 else None,
                       inflated=light_steps >= MIN_REFERENCE_STEPS and excess > spread
                       and excess >= MATERIAL_SHARE * step_ms)
        rows.append(row)
    schema = {"module": pl.Utf8, "module_type": pl.Utf8, "full_ms": pl.Float64, "light_ms": pl.Float64,
              "light_spread_ms": pl.Float64, "excess_ms": pl.Float64, "ratio": pl.Float64,
              "inflated": pl.Boolean}
    return pl.DataFrame(rows, schema=schema, orient="row").sort(["full_ms", "module"], descending=[True, False])


def reference_steps(reference: pl.DataFrame) -> int:
    """How many light reference steps a ``layer_reference`` table holds."""
    return 0 if reference.is_empty() else int(reference["step"].max()) + 1  # type: ignore[arg-type]


def inflation_note(inflation: pl.DataFrame, light_steps: int, shown: int = 5) -> str | None:
    """What the Run says of its light reference: too few steps to check, or the layers whose
    time the full capture inflated (None: enough steps, no layer inflated)."""
    if light_steps < MIN_REFERENCE_STEPS:
        return (f"{light_steps} light reference step{'s' if light_steps != 1 else ''} (the warm-up steps "
                f"after the first, observed without torch.profiler): too few to estimate a layer's "
                f"step-to-step spread ({MIN_REFERENCE_STEPS} needed: --warmup {MIN_REFERENCE_STEPS + 1} or "
                "more), so no layer is checked for time the full capture added")
    hit = inflation.filter(pl.col("inflated")).sort("excess_ms", descending=True)
    if hit.is_empty():
        return None
    named = ", ".join(f"{r['module']} {r['full_ms']:.2f} vs {r['light_ms']:.2f}"
                      + (f" (x{r['ratio']:.1f})" if r["ratio"] is not None else "")
                      for r in hit.head(shown).iter_rows(named=True))
    more = f" and {hit.height - shown} more" if hit.height > shown else ""
    return (f"the full capture inflated {hit.height} layer{'s' if hit.height != 1 else ''} beyond the "
            f"light reference ({light_steps} warm-up steps observed without torch.profiler; median ms "
            f"a step, full vs light): {named}{more}; a layer's light ms is its own time, the excess is "
            "the capture's cost")

__all__ = ["MATERIAL_SHARE", "MIN_REFERENCE_STEPS", "fwd_bwd_by_layer", "inflation_note", "layer_inflation",
           "reference_steps", "step_stats"]

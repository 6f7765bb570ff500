"""A captured Run at a glance: step-time statistics from its ``steps`` table, forward /
backward time per leaf layer from its ``layers`` table, and which layers' times a full
capture inflated, against its light reference (``layer_reference``).

The capture printer shows them right after a capture (no analysis package, no torch
needed to read them) and the analysis facade builds its breakdowns on them.
"""

from __future__ import annotations

from typing import Any

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


def _timed_leaves(layers: pl.DataFrame) -> pl.DataFrame:
    """The forward and backward rows of the leaf layers."""
    leaf = layers.filter(~pl.col("module").is_in(list(PSEUDO_MODULES))
                         & pl.col("phase").is_in(["forward", "backward"]))
    if "leaf" in leaf.columns:
        leaf = leaf.filter(pl.col("leaf").fill_null(True))
    return leaf


def _median_faults(layers: pl.DataFrame) -> dict[str, float]:
    """Per leaf layer, the median over the steps it ran in of its minor page faults a step
    (forward + backward); layers whose faults were not counted are left out."""
    leaf = _timed_leaves(layers)
    if "faults" not in leaf.columns or leaf.is_empty():
        return {}
    per_step = (leaf.group_by(["module", "step"])
                .agg(pl.col("faults").sum(), pl.col("faults").is_null().any().alias("uncounted"))
                .filter(~pl.col("uncounted")))
    return {m: float(f) for m, f in per_step.group_by("module").agg(pl.col("faults").median()).iter_rows()}


def _leaf_ms_per_step(layers: pl.DataFrame) -> tuple[int, dict[str, tuple[str | None, list[float]]]]:
    """The number of steps and, per leaf layer, its type and forward + backward ms in each step
    (0 in a step where it did not run)."""
    leaf = _timed_leaves(layers)
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
    of the step (``step_ms``). A layer the reference never saw has null light figures.
    ``full_faults`` and ``light_faults``: the median minor page faults a step in each (null:
    not counted), what an inflation is made of when the profiler made memory fault afresh."""
    _, full = _leaf_ms_per_step(layers)
    light_steps, light = _leaf_ms_per_step(reference)
    full_faults, light_faults = _median_faults(layers), _median_faults(reference)
    rows = []
    for module, (module_type, samples) in full.items():
        full_ms = _median(samples)
        row = {"module": module, "module_type": module_type, "full_ms": full_ms, "light_ms": None,
               "light_spread_ms": None, "excess_ms": None, "ratio": None, "inflated": False,
               "full_faults": full_faults.get(module), "light_faults": light_faults.get(module)}
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
              "inflated": pl.Boolean, "full_faults": pl.Float64, "light_faults": pl.Float64}
    return pl.DataFrame(rows, schema=schema, orient="row").sort(["full_ms", "module"], descending=[True, False])


def ranked_by_light(per_layer: pl.DataFrame, inflation: pl.DataFrame) -> pl.DataFrame:
    """``fwd_bwd_by_layer``'s rows with each layer's ``light_ms`` (``layer_inflation``) and ranked
    by it, heaviest first: a full capture's own cost inflates layers of many small ops or large
    fresh tensors, so its times would rank them above heavier layers; layers the reference
    never saw follow, by their full capture time."""
    light = inflation.select("module", "light_ms")
    return (per_layer.join(light, on="module", how="left")
            .sort(["light_ms", "total_ms", "module"], descending=[True, True, False], nulls_last=True))


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
    named = ", ".join(f"{r['module']} {r['full_ms']:.2f} vs {r['light_ms']:.2f}" + _ratio_and_faults(r)
                      for r in hit.head(shown).iter_rows(named=True))
    more = f" and {hit.height - shown} more" if hit.height > shown else ""
    faulted = [r for r in hit.iter_rows(named=True) if _faulted_afresh(r)]
    why = (f"; {len(faulted)} of them page-faulted far more under torch.profiler: their excess is memory "
           "faulted in afresh (the profiler's own records change how glibc's heap is reused), not the "
           "layer's work" if faulted else "")
    return (f"the full capture inflated {hit.height} layer{'s' if hit.height != 1 else ''} beyond the "
            f"light reference ({light_steps} warm-up steps observed without torch.profiler; median ms "
            f"a step, full vs light): {named}{more}; a layer's light ms is its own time, the excess is "
            f"the capture's cost{why}; the layer table ranks layers by their light ms")


FAULTED_AFRESH = 1000
"""Minor faults a step (4 MiB at 4 KiB pages) beyond which, at twice the light reference's,
a layer's excess under the profiler is said to be memory faulted in afresh."""


def _faulted_afresh(row: dict[str, Any]) -> bool:
    full, light = row.get("full_faults"), row.get("light_faults")
    return full is not None and light is not None and full - light >= FAULTED_AFRESH and full >= 2 * light


def _ratio_and_faults(row: dict[str, Any]) -> str:
    """`` (x3.2; 84,000 vs 2,000 page faults a step)``: the ratio and, where counted, the faults."""
    parts = [f"x{row['ratio']:.1f}"] if row["ratio"] is not None else []
    if row.get("full_faults") is not None and row.get("light_faults") is not None:
        parts.append(f"{row['full_faults']:,.0f} vs {row['light_faults']:,.0f} page faults a step")
    return f" ({'; '.join(parts)})" if parts else ""

__all__ = ["FAULTED_AFRESH", "MATERIAL_SHARE", "MIN_REFERENCE_STEPS", "fwd_bwd_by_layer", "inflation_note", "layer_inflation",
           "ranked_by_light", "reference_steps", "step_stats"]

"""Where a step's time goes: breakdowns of one Run's tables (seed 000, Fig 2).

Every function takes the tables it needs (already limited to measured steps) and the
number of measured steps, and returns a polars DataFrame with both the total over the
Run (``time_ms``) and the mean per step (``ms_per_step``), so Runs with different step
counts compare. ``share_pct`` is a share of the mean step time when the Run has one,
else of the table's own total.
"""

from __future__ import annotations

import polars as pl

from ..tables import PHASES
from ..vocabulary import PSEUDO_MODULES
from .taxonomy import is_native_op


def _share(df: pl.DataFrame, column: str, total: float | None) -> pl.DataFrame:
    denom = total if total else df[column].sum()
    if not denom:
        return df.with_columns(share_pct=pl.lit(0.0))
    return df.with_columns(share_pct=pl.col(column) / denom * 100.0)


def _grouped_time(
    df: pl.DataFrame, keys: list[str], n_steps: int, step_ms: float | None, time_col: str
) -> pl.DataFrame:
    out = (
        df.group_by(keys)
        .agg(calls=pl.len(), time_ms=pl.col(time_col).sum())
        .with_columns(
            calls_per_step=pl.col("calls") / n_steps,
            ms_per_step=pl.col("time_ms") / n_steps,
        )
        .sort(["time_ms", *keys], descending=[True, *([False] * len(keys))], nulls_last=True)
    )
    return _share(out, "ms_per_step", step_ms)


# ------------------------------------------------------------------------- primitives
def by_driver_direction(
    prims: pl.DataFrame, n_steps: int, step_ms: float | None = None
) -> pl.DataFrame:
    """oneDNN time by benchdnn driver x direction (conv FWD_B, conv BWD_W, reorder, ...)."""
    return _grouped_time(prims, ["driver", "direction"], n_steps, step_ms, "time_ms")


def by_driver(prims: pl.DataFrame, n_steps: int, step_ms: float | None = None) -> pl.DataFrame:
    """oneDNN time by driver."""
    return _grouped_time(prims, ["driver"], n_steps, step_ms, "time_ms")


def by_dtype_impl(prims: pl.DataFrame, n_steps: int, step_ms: float | None = None) -> pl.DataFrame:
    """oneDNN time by driver, data type configuration and implementation."""
    return _grouped_time(prims, ["driver", "cfg", "impl"], n_steps, step_ms, "time_ms")


def by_problem(prims: pl.DataFrame, n_steps: int, step_ms: float | None = None) -> pl.DataFrame:
    """oneDNN time per distinct primitive (driver, direction, dtype, problem)."""
    return _grouped_time(
        prims, ["driver", "direction", "cfg", "impl", "problem"], n_steps, step_ms, "time_ms"
    )


# ------------------------------------------------------------------------- framework ops
def by_op(ops: pl.DataFrame, n_steps: int, step_ms: float | None = None) -> pl.DataFrame:
    """Framework ops by name: calls, self time, the oneDNN part and the native part.

    ``native_ms`` is self time not spent in oneDNN (``self_time_ms - onednn_ms``) for
    kernel ops; ``overhead_ms`` is the self time of wrapper events (autograd engine
    nodes, record_function regions), which is framework bookkeeping.
    """
    onednn = pl.col("onednn_ms") if "onednn_ms" in ops.columns else pl.lit(0.0)
    rows = ops.with_columns(
        _native=is_native_op(pl.col("op")).fill_null(False),
        _onednn=onednn.fill_null(0.0),
    )
    out = (
        rows.group_by("op")
        .agg(
            calls=pl.col("calls").sum(),
            self_ms=pl.col("self_time_ms").sum(),
            total_ms=pl.col("total_time_ms").sum(),
            onednn_ms=pl.col("_onednn").sum(),
            native=pl.col("_native").first(),
        )
        .with_columns(
            native_ms=pl.when(pl.col("native"))
            .then((pl.col("self_ms") - pl.col("onednn_ms")).clip(lower_bound=0.0))
            .otherwise(0.0),
            overhead_ms=pl.when(pl.col("native")).then(0.0).otherwise(pl.col("self_ms")),
            calls_per_step=pl.col("calls") / n_steps,
            ms_per_step=pl.col("self_ms") / n_steps,
        )
        .sort(["self_ms", "op"], descending=[True, False])
    )
    return _share(out, "ms_per_step", step_ms)


def by_module_type(ops: pl.DataFrame, n_steps: int, step_ms: float | None = None) -> pl.DataFrame:
    """Framework op self time by the class of the module that ran it, and phase."""
    rows = ops.with_columns(pl.col("module_type").fill_null("(no module)"))
    out = (
        rows.group_by(["module_type", "phase"])
        .agg(calls=pl.col("calls").sum(), self_ms=pl.col("self_time_ms").sum())
        .with_columns(ms_per_step=pl.col("self_ms") / n_steps)
        .sort(["self_ms", "module_type"], descending=[True, False])
    )
    return _share(out, "ms_per_step", step_ms)


# ------------------------------------------------------------------------- layers, phases
def by_layer_phase(layers: pl.DataFrame, n_steps: int, step_ms: float | None = None) -> pl.DataFrame:
    """Module x phase: calls and time per step (seed 001's layer-wise breakdown)."""
    out = (
        layers.group_by(["module", "module_type", "phase"])
        .agg(
            calls=pl.col("calls").sum(),
            time_ms=pl.col("time_ms").sum(),
            leaf=pl.col("leaf").first() if "leaf" in layers.columns else pl.lit(True),
            params=pl.col("params").first() if "params" in layers.columns else pl.lit(None),
            trainable_params=(
                pl.col("trainable_params").first()
                if "trainable_params" in layers.columns
                else pl.lit(None)
            ),
        )
        .with_columns(
            calls_per_step=pl.col("calls") / n_steps, ms_per_step=pl.col("time_ms") / n_steps
        )
        .sort(["time_ms", "module", "phase"], descending=[True, False, False])
    )
    return _share(out, "ms_per_step", step_ms)


def by_phase(steps: pl.DataFrame) -> pl.DataFrame:
    """Mean and median time per phase of a step, and what the phases do not cover."""
    phase_cols = [f"{p}_ms" for p in PHASES if f"{p}_ms" in steps.columns]
    rows = [
        {
            "phase": col[: -len("_ms")],
            "ms_per_step": float(steps[col].fill_null(0.0).mean() or 0.0),
            "median_ms": float(steps[col].fill_null(0.0).median() or 0.0),
        }
        for col in phase_cols
    ]
    covered = pl.sum_horizontal([pl.col(c).fill_null(0.0) for c in phase_cols]) if phase_cols else pl.lit(0.0)
    rest = steps.select((pl.col("time_ms") - covered).alias("rest"))["rest"]
    step_mean = float(steps["time_ms"].mean() or 0.0)
    if float(rest.mean() or 0.0) > 1e-6 * max(step_mean, 1.0):
        rows.append(
            {"phase": "unattributed", "ms_per_step": float(rest.mean()), "median_ms": float(rest.median())}
        )
    out = pl.DataFrame(
        rows, schema={"phase": pl.Utf8, "ms_per_step": pl.Float64, "median_ms": pl.Float64}
    )
    return _share(out, "ms_per_step", step_mean or None)


# ------------------------------------------------------------------------- fwd / bwd
def fwd_bwd_ratio(
    n_steps: int,
    steps: pl.DataFrame | None = None,
    layers: pl.DataFrame | None = None,
    prims: pl.DataFrame | None = None,
    ops: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """Backward/forward time ratio seen at each level the Run has.

    ``step``: the phases' wall time; ``layers``: leaf modules; ``kernels``: native op
    self time plus oneDNN; ``onednn``: oneDNN primitives only. A step ratio far from the
    kernel ratio points at non-kernel code in one of the passes (seed 000, 2.6).
    """
    rows: list[dict[str, object]] = []

    def add(level: str, fwd: float, bwd: float) -> None:
        rows.append(
            {
                "level": level,
                "forward_ms": fwd / n_steps,
                "backward_ms": bwd / n_steps,
                "bwd_fwd_ratio": (bwd / fwd) if fwd > 0 else None,
            }
        )

    if steps is not None and {"forward_ms", "backward_ms"} <= set(steps.columns):
        add("step", float(steps["forward_ms"].sum() or 0.0), float(steps["backward_ms"].sum() or 0.0))
    if layers is not None and layers.height:
        leaf = layers.filter(~pl.col("module").is_in(list(PSEUDO_MODULES)))
        if "leaf" in leaf.columns:
            leaf = leaf.filter(pl.col("leaf").fill_null(True))
        add(
            "layers",
            float(leaf.filter(pl.col("phase") == "forward")["time_ms"].sum() or 0.0),
            float(leaf.filter(pl.col("phase") == "backward")["time_ms"].sum() or 0.0),
        )
    if ops is not None and ops.height:
        native = ops.filter(is_native_op(pl.col("op")).fill_null(False))
        add(
            "kernels",
            float(native.filter(pl.col("phase") == "forward")["self_time_ms"].sum() or 0.0),
            float(native.filter(pl.col("phase") == "backward")["self_time_ms"].sum() or 0.0),
        )
    if prims is not None and prims.height and prims["phase"].drop_nulls().len():
        add(
            "onednn",
            float(prims.filter(pl.col("phase") == "forward")["time_ms"].sum() or 0.0),
            float(prims.filter(pl.col("phase") == "backward")["time_ms"].sum() or 0.0),
        )
    elif prims is not None and prims.height and "direction" in prims.columns:
        d = pl.col("direction").fill_null("")
        add(
            "onednn",
            float(prims.filter(d.str.starts_with("FWD"))["time_ms"].sum() or 0.0),
            float(prims.filter(d.str.starts_with("BWD"))["time_ms"].sum() or 0.0),
        )
    return pl.DataFrame(
        rows,
        schema={
            "level": pl.Utf8,
            "forward_ms": pl.Float64,
            "backward_ms": pl.Float64,
            "bwd_fwd_ratio": pl.Float64,
        },
    )


def loss_backward(
    n_steps: int,
    layers: pl.DataFrame | None = None,
    spans: pl.DataFrame | None = None,
    ops: pl.DataFrame | None = None,
) -> tuple[float, str]:
    """Time per step of the loss's backward, and how it was found.

    The backward rows in ``layers`` of the modules that ran in the loss phase (the
    ``loss`` pseudo-module, ``CrossEntropyLoss``, ...); else the time from the start of
    the backward phase to the first layer's backward span (autograd runs the loss's
    gradient first, before any layer's backward hook fires); else the self time of ops
    attributed to the ``loss`` module in the backward phase.
    """
    if layers is not None and layers.height:
        loss_modules = layers.filter(pl.col("phase") == "loss")["module"].unique().to_list()
        rows = layers.filter(pl.col("module").is_in(loss_modules or ["loss"]) & (pl.col("phase") == "backward"))
        if rows.height:
            return float(rows["time_ms"].sum()) / n_steps, "the loss modules' backward"
    if spans is not None and spans.height:
        phase = (
            spans.filter((pl.col("kind") == "phase") & (pl.col("phase") == "backward"))
            .group_by("step").agg(start=pl.col("start_ms").min())
        )
        first = (
            spans.filter((pl.col("kind") == "module") & (pl.col("phase") == "backward"))
            .group_by("step").agg(first=pl.col("start_ms").min())
        )
        j = phase.join(first, on="step", how="inner")
        if j.height:
            gap = float((j["first"] - j["start"]).clip(lower_bound=0.0).sum())
            return gap / n_steps, "backward before the first layer's backward"
    if ops is not None and ops.height:
        rows = ops.filter((pl.col("module") == "loss") & (pl.col("phase") == "backward"))
        if rows.height:
            return float(rows["self_time_ms"].sum()) / n_steps, "ops of the loss module in backward"
    return 0.0, ""


# ------------------------------------------------------------------------- coverage
COVERAGE_LABELS: dict[str, str] = {
    "onednn": "oneDNN primitives",
    "aten": "native ATen ops (not oneDNN)",
    "overhead": "framework overhead (no op)",
    "unattributed": "not attributed (no op capture)",
}


def coverage(
    n_steps: int,
    steps: pl.DataFrame | None,
    prims: pl.DataFrame | None,
    ops: pl.DataFrame | None,
) -> pl.DataFrame:
    """How much of the step oneDNN, native ATen ops and neither account for.

    step = oneDNN primitive time + native op self time not spent in oneDNN + the rest.
    The rest is time no kernel op accounts for: Python, dispatch, autograd bookkeeping
    (framework overhead). Without an ops table (``--light``) the rest stays
    ``unattributed``. Without steps (a bare log) only oneDNN is known.
    """
    onednn = float(prims["time_ms"].sum() or 0.0) if prims is not None else 0.0
    rows: list[tuple[str, float]] = [("onednn", onednn)]
    step_total = float(steps["time_ms"].sum() or 0.0) if steps is not None else None
    if ops is not None:
        native_self = float(
            ops.filter(is_native_op(pl.col("op")).fill_null(False))["self_time_ms"].sum() or 0.0
        )
        aten = max(native_self - onednn, 0.0)
        rows.append(("aten", aten))
        if step_total is not None:
            rows.append(("overhead", max(step_total - onednn - aten, 0.0)))
    elif step_total is not None:
        rows.append(("unattributed", max(step_total - onednn, 0.0)))
    out = pl.DataFrame(
        {
            "component": [c for c, _ in rows],
            "label": [COVERAGE_LABELS[c] for c, _ in rows],
            "ms_per_step": [v / n_steps for _, v in rows],
        }
    )
    return _share(out, "ms_per_step", (step_total / n_steps) if step_total else None)


def coverage_by_phase(
    steps: pl.DataFrame, prims: pl.DataFrame | None, ops: pl.DataFrame | None, n_steps: int
) -> pl.DataFrame:
    """Coverage within each phase: phase time, oneDNN, native ATen and the rest."""
    rows = []
    for phase in PHASES:
        col = f"{phase}_ms"
        if col not in steps.columns:
            continue
        total = float(steps[col].fill_null(0.0).sum())
        onednn = (
            float(prims.filter(pl.col("phase") == phase)["time_ms"].sum() or 0.0)
            if prims is not None and "phase" in prims.columns
            else 0.0
        )
        aten = None
        if ops is not None:
            native_self = float(
                ops.filter(
                    (pl.col("phase") == phase) & is_native_op(pl.col("op")).fill_null(False)
                )["self_time_ms"].sum()
                or 0.0
            )
            aten = max(native_self - onednn, 0.0)
        rest = max(total - onednn - (aten or 0.0), 0.0)
        rows.append(
            {
                "phase": phase,
                "ms_per_step": total / n_steps,
                "onednn_ms": onednn / n_steps,
                "aten_ms": None if aten is None else aten / n_steps,
                "rest_ms": rest / n_steps,
            }
        )
    return pl.DataFrame(
        rows,
        schema={
            "phase": pl.Utf8,
            "ms_per_step": pl.Float64,
            "onednn_ms": pl.Float64,
            "aten_ms": pl.Float64,
            "rest_ms": pl.Float64,
        },
    )

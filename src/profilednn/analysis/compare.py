"""Compare two Runs: a reference (A) and a custom setup (B) (seed 000, 2.1-2.2, Fig 4).

Ratio breakdowns per phase, driver, op and layer (B / A per step, and how much of the
step-time change each part explains); call-count differences; kernels present in one
Run only; modules that run as several small elementwise kernels in one Run and as one
kernel in the other; primitives whose implementation or memory format changed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from ..tables import OPS, PRIMITIVES
from .rulebook import Advice, severity_for
from .rules import rank_advice
from .taxonomy import BOOKKEEPING_OPS, is_elementwise_op, is_kernel_op, is_native_op

if TYPE_CHECKING:
    from .view import RunBreakdowns

NONE_KEY = "(none)"


def ratio_table(
    a: pl.DataFrame,
    b: pl.DataFrame,
    keys: list[str],
    value: str = "ms_per_step",
    total_a: float | None = None,
    total_b: float | None = None,
) -> pl.DataFrame:
    """Join two per-step tables on ``keys``: ``a_ms``, ``b_ms``, ``ratio`` (B/A), ``delta_ms``.

    ``a_share_pct`` / ``b_share_pct`` are shares of each Run's total (its step time when
    given), ``contribution_pct`` the part of the total change this row explains.
    """

    def prep(df: pl.DataFrame, side: str) -> pl.DataFrame:
        out = df.select([pl.col(k).cast(pl.Utf8).fill_null(NONE_KEY) for k in keys] + [pl.col(value)])
        return out.group_by(keys).agg(pl.col(value).sum().alias(f"{side}_ms"))

    ta = total_a if total_a else float(a[value].sum() or 0.0)
    tb = total_b if total_b else float(b[value].sum() or 0.0)
    change = tb - ta
    j = prep(a, "a").join(prep(b, "b"), on=keys, how="full", coalesce=True)
    j = j.with_columns(pl.col("a_ms").fill_null(0.0), pl.col("b_ms").fill_null(0.0))
    return (
        j.with_columns(
            ratio=pl.when(pl.col("a_ms") > 0).then(pl.col("b_ms") / pl.col("a_ms")).otherwise(None),
            delta_ms=pl.col("b_ms") - pl.col("a_ms"),
            a_share_pct=(pl.col("a_ms") / ta * 100.0) if ta else pl.lit(None, pl.Float64),
            b_share_pct=(pl.col("b_ms") / tb * 100.0) if tb else pl.lit(None, pl.Float64),
        )
        .with_columns(
            contribution_pct=(pl.col("delta_ms") / change * 100.0) if abs(change) > 1e-12 else pl.lit(None, pl.Float64)
        )
        .sort([pl.col("delta_ms").abs(), *keys], descending=[True, *([False] * len(keys))])
    )


def _count_table(rows: pl.DataFrame, keys: list[str], calls: pl.Expr, n_steps: int) -> pl.DataFrame:
    return (
        rows.with_columns([pl.col(k).cast(pl.Utf8).fill_null(NONE_KEY) for k in keys])
        .group_by(keys)
        .agg(calls=calls, ms=pl.col("_t").sum())
        .with_columns(calls_per_step=pl.col("calls") / n_steps, ms_per_step=pl.col("ms") / n_steps)
    )


def _name(df: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    parts = [pl.when(pl.col(k) != NONE_KEY).then(pl.col(k)) for k in keys]
    return df.with_columns(name=pl.concat_str(parts, separator=" ", ignore_nulls=True))


def call_count_diff(
    a: pl.DataFrame, b: pl.DataFrame, keys: list[str], kind: str, n_a: int, n_b: int, calls_col: str | None = None
) -> pl.DataFrame:
    """Calls per step of each key in A and B, where they differ."""
    calls = pl.col(calls_col).sum() if calls_col else pl.len()
    ta = _count_table(a, keys, calls, n_a)
    tb = _count_table(b, keys, calls, n_b)
    j = ta.select([*keys, pl.col("calls_per_step").alias("a_calls_per_step")]).join(
        tb.select([*keys, pl.col("calls_per_step").alias("b_calls_per_step")]), on=keys, how="full", coalesce=True
    )
    j = j.with_columns(pl.col("a_calls_per_step").fill_null(0.0), pl.col("b_calls_per_step").fill_null(0.0))
    j = _name(j, keys).with_columns(
        kind=pl.lit(kind), delta_calls_per_step=pl.col("b_calls_per_step") - pl.col("a_calls_per_step")
    )
    return j.filter(pl.col("delta_calls_per_step").abs() > 1e-9).select(
        "kind", "name", "a_calls_per_step", "b_calls_per_step", "delta_calls_per_step"
    )


def missing_keys(
    a: pl.DataFrame, b: pl.DataFrame, keys: list[str], kind: str, n_a: int, n_b: int, calls_col: str | None = None
) -> pl.DataFrame:
    """Keys present in one Run and absent from the other, with their cost where present."""
    calls = pl.col(calls_col).sum() if calls_col else pl.len()
    ta = _name(_count_table(a, keys, calls, n_a), keys)
    tb = _name(_count_table(b, keys, calls, n_b), keys)
    only_a = ta.join(tb.select(keys), on=keys, how="anti").with_columns(only_in=pl.lit("A"))
    only_b = tb.join(ta.select(keys), on=keys, how="anti").with_columns(only_in=pl.lit("B"))
    cols = ["kind", "name", "only_in", "calls_per_step", "ms_per_step"]
    return pl.concat(
        [d.with_columns(kind=pl.lit(kind)).select(cols) for d in (only_a, only_b)]
    ).sort("ms_per_step", descending=True)


def _dominant_impl(prims: pl.DataFrame, key: list[str]) -> pl.DataFrame:
    fmt = pl.concat_str(
        [
            pl.lit("src:") + pl.col("src_tag").fill_null("-"),
            pl.lit("wei:") + pl.col("wei_tag").fill_null("-"),
            pl.lit("dst:") + pl.col("dst_tag").fill_null("-"),
        ],
        separator=" ",
    )
    per = (
        prims.with_columns(formats=fmt)
        .group_by([*key, "impl", "formats"])
        .agg(ms=pl.col("time_ms").sum())
        .sort("ms", descending=True)
    )
    return per.group_by(key, maintain_order=True).agg(
        impl=pl.col("impl").first(), formats=pl.col("formats").first(), ms=pl.col("ms").sum()
    )


def implementation_changes(a: pl.DataFrame, b: pl.DataFrame, n_a: int, n_b: int) -> pl.DataFrame:
    """Primitives (matched by driver, direction and module, else problem) whose dominant
    implementation or memory formats differ between A and B."""
    key = ["driver", "direction", "where"]

    def prep(df: pl.DataFrame) -> pl.DataFrame:
        return df.filter(pl.col("driver") != "reorder").with_columns(
            where=pl.coalesce(pl.col("module"), pl.col("problem")).fill_null(NONE_KEY),
            direction=pl.col("direction").fill_null(NONE_KEY),
        )

    da = _dominant_impl(prep(a), key).rename({"impl": "a_impl", "formats": "a_formats", "ms": "a_ms"})
    db = _dominant_impl(prep(b), key).rename({"impl": "b_impl", "formats": "b_formats", "ms": "b_ms"})
    j = da.join(db, on=key, how="inner").with_columns(
        pl.col("a_ms") / n_a, pl.col("b_ms") / n_b
    )
    return j.filter(
        (pl.col("a_impl") != pl.col("b_impl")) | (pl.col("a_formats") != pl.col("b_formats"))
    ).sort("b_ms", descending=True)


def module_kernels(ops: pl.DataFrame, layers: pl.DataFrame | None, n_steps: int) -> pl.DataFrame:
    """Per module (forward): elementwise and compute kernel calls per module call.

    Kernels are native ops that do the work themselves (composites such as
    ``aten::conv2d`` and bookkeeping such as views, ``empty`` and ``to`` excluded);
    ``kernels`` lists them as ``op×calls per module call``.
    """
    rows = ops.filter(
        (pl.col("phase") == "forward") & pl.col("module").is_not_null() & is_kernel_op(pl.col("op"))
    )
    per_op = rows.group_by(["module", "op"]).agg(
        module_type=pl.col("module_type").first(), calls=pl.col("calls").sum(), ms=pl.col("self_time_ms").sum()
    )
    if layers is not None and layers.height:
        calls = layers.filter(pl.col("phase") == "forward").group_by("module").agg(module_calls=pl.col("calls").sum())
        per_op = per_op.join(calls, on="module", how="left")
    else:
        per_op = per_op.with_columns(module_calls=pl.lit(None, pl.Int64))
    per_op = per_op.with_columns(
        module_calls=pl.col("module_calls").fill_null(n_steps).cast(pl.Float64)
    ).with_columns(per_call=(pl.col("calls") / pl.col("module_calls")).round(1))
    per_call_text = (
        pl.when(pl.col("per_call") == pl.col("per_call").round(0))
        .then(pl.col("per_call").cast(pl.Int64).cast(pl.Utf8))
        .otherwise(pl.col("per_call").cast(pl.Utf8))
    )
    ew = is_elementwise_op(pl.col("op"))
    per_module = (
        per_op.sort(["ms", "op"], descending=[True, False])
        .group_by("module", maintain_order=True)
        .agg(
            module_type=pl.col("module_type").first(),
            module_calls=pl.col("module_calls").first(),
            elementwise_calls=pl.col("calls").filter(ew).sum(),
            ew_ms=pl.col("ms").filter(ew).sum(),
            kernel_calls=pl.col("calls").sum(),
            ms=pl.col("ms").sum(),
            kernels=pl.concat_str([pl.col("op"), pl.lit("\u00d7"), per_call_text]).str.join(", "),
        )
    )
    return per_module.with_columns(
        elementwise_per_call=pl.col("elementwise_calls") / pl.col("module_calls"),
        kernels_per_call=pl.col("kernel_calls") / pl.col("module_calls"),
        ms_per_step=pl.col("ms") / n_steps,
        ew_ms_per_step=pl.col("ew_ms") / n_steps,
    )


SPLIT_MIN_ELEMENTWISE_PER_CALL = 2.0


def split_modules(
    a_ops: pl.DataFrame,
    b_ops: pl.DataFrame,
    a_layers: pl.DataFrame | None,
    b_layers: pl.DataFrame | None,
    n_a: int,
    n_b: int,
) -> pl.DataFrame:
    """Modules that run as >= 2 elementwise kernels per call in one Run and as a single
    kernel in the other (FrozenBatchNorm2d's mul + add vs one batch-norm kernel)."""
    ka = module_kernels(a_ops, a_layers, n_a)
    kb = module_kernels(b_ops, b_layers, n_b)
    cols = ["module_type", "elementwise_per_call", "kernels_per_call", "kernels", "ms_per_step", "ew_ms_per_step"]
    j = ka.select(["module", *cols]).join(kb.select(["module", *cols]), on="module", how="inner", suffix="_b")
    j = j.rename({c: f"a_{c}" for c in cols}).rename({f"{c}_b": f"b_{c}" for c in cols})
    split_a = (pl.col("a_elementwise_per_call") >= SPLIT_MIN_ELEMENTWISE_PER_CALL) & (pl.col("b_kernels_per_call") <= 1.0)
    split_b = (pl.col("b_elementwise_per_call") >= SPLIT_MIN_ELEMENTWISE_PER_CALL) & (pl.col("a_kernels_per_call") <= 1.0)
    out = j.filter(split_a | split_b).with_columns(
        split_in=pl.when(split_a).then(pl.lit("A")).otherwise(pl.lit("B"))
    )
    return out.select(
        "module", "split_in", "a_module_type", "b_module_type",
        "a_kernels_per_call", "b_kernels_per_call", "a_kernels", "b_kernels",
        "a_ms_per_step", "b_ms_per_step",
    ).sort(pl.max_horizontal("a_ms_per_step", "b_ms_per_step"), descending=True)


class Comparison:
    """Run A (the reference) against Run B (the custom setup); B/A ratios throughout."""

    def __init__(self, a: "RunBreakdowns", b: "RunBreakdowns"):
        self.a, self.b = a, b

    # -- totals ----------------------------------------------------------------------
    def summary(self) -> dict[str, float | None]:
        """Mean step times, their ratio, and total oneDNN time per step."""
        def onednn(x: "RunBreakdowns") -> float | None:
            return float(x.primitives["time_ms"].sum()) / x.n_steps if x.primitives is not None else None

        sa, sb = self.a.step_ms, self.b.step_ms
        return {
            "a_step_ms": sa,
            "b_step_ms": sb,
            "step_ratio": (sb / sa) if sa and sb else None,
            "a_onednn_ms": onednn(self.a),
            "b_onednn_ms": onednn(self.b),
        }

    def _totals(self) -> dict[str, float | None]:
        return {"total_a": self.a.step_ms, "total_b": self.b.step_ms}

    # -- ratio breakdowns (Fig 4) ----------------------------------------------------
    def phases(self) -> pl.DataFrame:
        return ratio_table(self.a.by_phase(), self.b.by_phase(), ["phase"], **self._totals())

    def drivers(self) -> pl.DataFrame:
        return ratio_table(self.a.by_driver(), self.b.by_driver(), ["driver"], **self._totals())

    def driver_directions(self) -> pl.DataFrame:
        return ratio_table(
            self.a.by_driver_direction(), self.b.by_driver_direction(), ["driver", "direction"], **self._totals()
        )

    def ops(self) -> pl.DataFrame:
        return ratio_table(self.a.by_op(), self.b.by_op(), ["op"], **self._totals())

    def layers(self) -> pl.DataFrame:
        return ratio_table(
            self.a.by_layer_phase(), self.b.by_layer_phase(), ["module", "phase"], **self._totals()
        )

    def coverage(self) -> pl.DataFrame:
        return ratio_table(self.a.coverage(), self.b.coverage(), ["component"], **self._totals())

    # -- discrepancies ---------------------------------------------------------------
    def call_counts(self) -> pl.DataFrame:
        """Call-count differences per step: primitives (driver x direction) and ops."""
        parts = []
        pa, pb = self.a.primitives, self.b.primitives
        if pa is not None and pb is not None:
            parts.append(
                call_count_diff(
                    pa.with_columns(_t=pl.col("time_ms")), pb.with_columns(_t=pl.col("time_ms")),
                    ["driver", "direction"], "primitive", self.a.n_steps, self.b.n_steps,
                )
            )
        oa, ob = self.a.ops, self.b.ops
        if oa is not None and ob is not None:
            parts.append(
                call_count_diff(
                    oa.with_columns(_t=pl.col("self_time_ms")), ob.with_columns(_t=pl.col("self_time_ms")),
                    ["op"], "op", self.a.n_steps, self.b.n_steps, calls_col="calls",
                )
            )
        if not parts:
            return pl.DataFrame(
                schema={"kind": pl.Utf8, "name": pl.Utf8, "a_calls_per_step": pl.Float64,
                        "b_calls_per_step": pl.Float64, "delta_calls_per_step": pl.Float64}
            )
        return pl.concat(parts).sort(pl.col("delta_calls_per_step").abs(), descending=True)

    def missing(self) -> pl.DataFrame:
        """Kernels (driver x direction x dtype) and native ops present in only one Run."""
        parts = []
        pa, pb = self.a.primitives, self.b.primitives
        if pa is not None and pb is not None:
            parts.append(
                missing_keys(
                    pa.with_columns(_t=pl.col("time_ms")), pb.with_columns(_t=pl.col("time_ms")),
                    ["driver", "direction", "cfg"], "primitive", self.a.n_steps, self.b.n_steps,
                )
            )
        oa, ob = self.a.ops, self.b.ops
        if oa is not None and ob is not None:
            native_a = oa.filter(is_native_op(pl.col("op")).fill_null(False) & ~pl.col("op").is_in(list(BOOKKEEPING_OPS)))
            native_b = ob.filter(is_native_op(pl.col("op")).fill_null(False) & ~pl.col("op").is_in(list(BOOKKEEPING_OPS)))
            parts.append(
                missing_keys(
                    native_a.with_columns(_t=pl.col("self_time_ms")), native_b.with_columns(_t=pl.col("self_time_ms")),
                    ["op"], "op", self.a.n_steps, self.b.n_steps, calls_col="calls",
                )
            )
        if not parts:
            return pl.DataFrame(
                schema={"kind": pl.Utf8, "name": pl.Utf8, "only_in": pl.Utf8,
                        "calls_per_step": pl.Float64, "ms_per_step": pl.Float64}
            )
        return pl.concat(parts).sort("ms_per_step", descending=True)

    def impl_changes(self) -> pl.DataFrame:
        return implementation_changes(
            self.a.need(PRIMITIVES.name), self.b.need(PRIMITIVES.name), self.a.n_steps, self.b.n_steps
        )

    def elementwise_splits(self) -> pl.DataFrame:
        return split_modules(
            self.a.need(OPS.name), self.b.need(OPS.name), self.a.layers, self.b.layers, self.a.n_steps, self.b.n_steps
        )

    # -- advice ----------------------------------------------------------------------
    def advice(self) -> list[Advice]:
        """B's own advice plus what the comparison with A shows, ranked by gain."""
        found = rank_advice(self.b)
        extra = [x for x in (self._extra_backward_convs(), self._split_advice()) if x is not None]
        return sorted(found + extra, key=lambda x: (-x.estimated_gain_pct, x.rule))

    def _denominator(self) -> float | None:
        if self.b.step_ms:
            return self.b.step_ms
        if self.b.primitives is not None and self.b.primitives.height:
            return float(self.b.primitives["time_ms"].sum()) / self.b.n_steps or None
        return None

    def _extra_backward_convs(self) -> Advice | None:
        """B runs more backward convolutions per step than A (seed 000, 2.5: weight
        gradients of frozen layers). Gain: the extra calls at B's mean time per call."""
        pa, pb, denom = self.a.primitives, self.b.primitives, self._denominator()
        if pa is None or pb is None or not denom:
            return None
        lines, extra_ms = [], 0.0
        for direction in ("BWD_D", "BWD_W", "BWD_WB"):
            ca = pa.filter((pl.col("driver") == "conv") & (pl.col("direction") == direction))
            cb = pb.filter((pl.col("driver") == "conv") & (pl.col("direction") == direction))
            na, nb = ca.height / self.a.n_steps, cb.height / self.b.n_steps
            if nb > na and cb.height:
                mean = float(cb["time_ms"].mean())
                extra_ms += (nb - na) * mean
                lines.append(f"conv {direction}: {nb:.0f} vs {na:.0f} calls per step")
        if not lines:
            return None
        gain = extra_ms / denom * 100.0
        return Advice(
            rule="extra_backward_convolutions",
            severity=severity_for(gain),
            evidence=f"B runs more backward convolutions than A ({'; '.join(lines)}), {extra_ms:.2f} ms per step",
            estimated_gain_pct=gain,
            action=(
                "Check which layers are meant to be frozen: backward convolutions that A skips "
                "usually come from frozen layers whose parameters still require grad; set "
                "requires_grad_(False) on them."
            ),
        )

    def _split_advice(self) -> Advice | None:
        """Modules that B runs as several elementwise kernels where A runs one kernel.
        Gain: the time B spends in them beyond A's time for the same modules."""
        if self.a.ops is None or self.b.ops is None or not self.b.step_ms:
            return None
        splits = self.elementwise_splits().filter(pl.col("split_in") == "B")
        if splits.height == 0:
            return None
        extra = float((splits["b_ms_per_step"] - splits["a_ms_per_step"]).clip(lower_bound=0.0).sum())
        gain = extra / self.b.step_ms * 100.0
        first = splits.row(0, named=True)
        return Advice(
            rule="elementwise_split",
            severity=severity_for(gain),
            evidence=(
                f"{splits.height} module(s) run as several elementwise kernels in B but one kernel "
                f"in A, e.g. {first['module']} ({first['b_module_type']}: {first['b_kernels']} vs "
                f"{first['a_module_type']}: {first['a_kernels']}); {extra:.2f} ms per step more"
            ),
            estimated_gain_pct=gain,
            action=(
                "Use A's single-kernel form for these modules (a fused per-channel affine or the "
                "native batch-norm kernel for FrozenBatchNorm2d), or torch.compile them."
            ),
        )

"""Project a Run: replay its primitives and ops alone, weigh by calls, compare with the step.

projected kernel time = sum over unique primitives/ops of calls x replay time (items that
could not be replayed count at their in-situ time, and ``coverage`` says how much was
replayed); efficiency = projected kernel time / measured step time, for the step and per
driver, layer and phase. The roofline gives each primitive's attainable time from the
machine's measured peaks, and the step's ceiling; MFU holds each compute dtype's model
FLOPs against that dtype's measured GEMM peak (``dtypes.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import polars as pl

from ..errors import InputError, NoPrimitivesError, RunError
from ..run import Run, load_run
from ..tables import (
    OP_EVENTS,
    OPS,
    PRIMITIVES,
    PROJECTION_BREAKDOWN,
    PROJECTION_CONV_CALLS,
    PROJECTION_OPS,
    PROJECTION_PRIMITIVES,
    PROJECTION_STEP,
    STEPS,
)
from ..topology import cpu_topology
from ..hardware.dtypes import flops_by_dtype, mfu_assumption, native_conv_flops_by_dtype, peaks_by_dtype, summary_fields
from ..hardware.machine import MachineProfile, cached_machine, get_machine
from ..hardware.roofline import add_roofline, op_flops_bytes
from ..vocabulary import ONEDNN_DTYPE, PROFILER_DTYPE, cfg_dtype, op_dtype, op_family
from .cases import PRIM_KEY, op_case, parse_shapes, primitive_case, unique_primitives
from .replay import ReplayResult, match_primitives, run_worker
from .replay_cache import replay_cache, step_footprint_bytes
from .nesting import OPS_KEY, nested_calls, per_unique_op, taken_out
from .step_model import (CALIBRATION_BOUNDS, attach_conv_replay, calibrate_ops, conv_calls,
                         native_calibration, step_parts, step_summary)

ProgressFn = Callable[[int, int], None]
TABLE_PRIMITIVES = PROJECTION_PRIMITIVES.name  # the catalogue's names (profilednn.tables)
TABLE_OPS = PROJECTION_OPS.name
TABLE_BREAKDOWN = PROJECTION_BREAKDOWN.name
TABLE_STEP = PROJECTION_STEP.name  # the step model (step_model.py), per phase and part
TABLE_CONV_CALLS = PROJECTION_CONV_CALLS.name
MANIFEST_KEY = "kernel_projection"  # "projection" is the distributed job's key


@dataclass
class Projection:
    """A Run's projection: per-primitive and per-op tables, breakdowns and totals."""

    primitives: pl.DataFrame
    ops: pl.DataFrame
    breakdown: pl.DataFrame
    summary: dict[str, Any]
    assumptions: list[str] = field(default_factory=list)
    run_path: Path | None = None
    step: pl.DataFrame = field(default_factory=pl.DataFrame)  # step_model.step_parts
    conv_calls: pl.DataFrame = field(default_factory=pl.DataFrame)

    @property
    def by_driver(self) -> pl.DataFrame:
        return self._level("driver")

    @property
    def by_layer(self) -> pl.DataFrame:
        return self._level("layer")

    @property
    def by_phase(self) -> pl.DataFrame:
        return self._level("phase")

    def _level(self, level: str) -> pl.DataFrame:
        return self.breakdown.filter(pl.col("level") == level).drop("level").sort(
            "in_situ_ms", descending=True)

    def to_dict(self) -> dict[str, Any]:
        return {
            "run": str(self.run_path) if self.run_path else None,
            "summary": self.summary,
            "assumptions": self.assumptions,
            "primitives": self.primitives.to_dicts(),
            "ops": self.ops.to_dicts(),
            "by_driver": self.by_driver.to_dicts(),
            "by_layer": self.by_layer.to_dicts(),
            "by_phase": self.by_phase.to_dicts(),
            "step": self.step.to_dicts(),
            "conv_calls": self.conv_calls.to_dicts(),
        }

    def save(self, run: Run) -> None:
        """Write the tables into the Run and the totals into its manifest."""
        run.write_table(PROJECTION_PRIMITIVES, self.primitives)
        run.write_table(PROJECTION_OPS, self.ops)
        run.write_table(PROJECTION_BREAKDOWN, self.breakdown)
        for name, tab in ((PROJECTION_STEP, self.step), (PROJECTION_CONV_CALLS, self.conv_calls)):
            if not tab.is_empty():
                run.write_table(name, tab)
        run.update(**{MANIFEST_KEY: {"summary": self.summary, "assumptions": self.assumptions}})


def load_projection(run: Run | Path | str) -> Projection | None:
    """The projection stored in a Run (None when the Run has not been projected)."""
    run = run if isinstance(run, Run) else load_run(run)
    meta = run.manifest.get(MANIFEST_KEY)
    if not meta or not run.has_table(TABLE_PRIMITIVES):
        return None
    ops = run.table(TABLE_OPS) if run.has_table(TABLE_OPS) else pl.DataFrame()
    breakdown = run.table(TABLE_BREAKDOWN) if run.has_table(TABLE_BREAKDOWN) else pl.DataFrame(
        schema={"level": pl.Utf8, "name": pl.Utf8, "in_situ_ms": pl.Float64})
    extra = {k: run.table(t) for k, t in (("step", TABLE_STEP), ("conv_calls", TABLE_CONV_CALLS))
             if run.has_table(t)}
    return Projection(run.table(TABLE_PRIMITIVES), ops, breakdown, dict(meta.get("summary") or {}),
                      list(meta.get("assumptions") or []), run.path, **extra)


# --------------------------------------------------------------------------- inputs
def _steps(run: Run) -> tuple[int, float | None]:
    steps = run.table(STEPS) if run.has_table(STEPS) else pl.DataFrame()
    n = int(run.manifest.get("steps") or steps.height or 1)
    measured = float(steps["time_ms"].median()) if not steps.is_empty() else None
    return max(n, 1), measured


def run_threads(run: Run) -> int:
    """The thread count the Run was captured with (all cores here when not recorded)."""
    t = run.fingerprint.get("threads")
    return int(t) if t else cpu_topology().physical_cores


def _exec_primitives(run: Run) -> pl.DataFrame:
    if not run.has_table(PRIMITIVES):
        return pl.DataFrame()
    p = run.table(PRIMITIVES)
    if p.is_empty():
        return p
    if "event" in p.columns:
        p = p.filter(pl.col("event") == "exec")
    if "engine" in p.columns:
        p = p.filter(pl.col("engine").fill_null("cpu") == "cpu")
    if "step" in p.columns and p["step"].is_not_null().any():
        p = p.filter(pl.col("step").is_not_null())
    return p


def _replayable_ops(run: Run) -> pl.DataFrame:
    """Framework-op rows that are compute kernels outside oneDNN (one per module/phase/step)."""
    if not run.has_table(OPS):
        return pl.DataFrame()
    ops = run.table(OPS)
    if ops.is_empty():
        return ops
    fam = [op_family(o) for o in ops["op"].to_list()]
    ops = ops.with_columns(pl.Series("family", fam, dtype=pl.Utf8))
    keep = pl.col("family").is_not_null()
    if "onednn_ms" in ops.columns:
        keep = keep & (pl.col("onednn_ms").fill_null(0.0) <= 0.0)
    return ops.filter(keep)


# --------------------------------------------------------------------------- assembly
def _prim_cases(unique: pl.DataFrame) -> tuple[list[dict], pl.DataFrame]:
    cases, notes = [], []
    for row in unique.iter_rows(named=True):
        case, why = primitive_case(row)
        notes.append(why)
        if case is not None:
            case["id"] = row["case_id"]
            cases.append(case)
    return cases, unique.with_columns(pl.Series("note", notes, dtype=pl.Utf8))


def _unique_ops(ops: pl.DataFrame) -> tuple[list[dict], pl.DataFrame]:
    """One case per (op, shapes, dtypes); pooling windows inferred from backward shapes."""
    if ops.is_empty():
        return [], pl.DataFrame()
    out_hw: dict[str | None, list[int]] = {}
    for r in ops.filter(pl.col("op") == "aten::max_pool2d_with_indices_backward").iter_rows(named=True):
        shapes = parse_shapes(r["input_shapes"])
        if shapes and isinstance(shapes[0], list) and len(shapes[0]) == 4:
            out_hw[r["module"]] = shapes[0][2:]
    uniq = (ops.group_by("op", "input_shapes", "dtypes", maintain_order=True)
            .agg(pl.col("family").first(), pl.col("calls").sum(),
                 pl.col("self_time_ms").sum().alias("in_situ_total_ms"),
                 pl.col("module").first())
            .with_row_index("oid").with_columns(pl.format("o{}", pl.col("oid")).alias("case_id"))
            .drop("oid"))
    cases, notes, flops, nbytes, dts = [], [], [], [], []
    for r in uniq.iter_rows(named=True):
        shapes = parse_shapes(r["input_shapes"])
        dtypes = parse_shapes(r["dtypes"])
        case, note = op_case(r["op"], shapes, dtypes, None, out_hw.get(r["module"]))
        if case is not None:
            case["id"] = r["case_id"]
            case["evict"] = True  # timed cold, as in a step (worker.py, step_model.py)
            cases.append(case)
        notes.append(note)
        f, b = op_flops_bytes(r["op"], shapes, dtypes) if shapes else (0.0, 0.0)
        flops.append(f)
        nbytes.append(b)
        dts.append(op_dtype(dtypes))
    uniq = uniq.drop("module").with_columns(
        pl.Series("note", notes, dtype=pl.Utf8), pl.Series("flops", flops, dtype=pl.Float64),
        pl.Series("bytes", nbytes, dtype=pl.Float64), pl.Series("dtype", dts, dtype=pl.Utf8),
        (pl.col("in_situ_total_ms") / pl.col("calls")).alias("in_situ_ms"))
    return cases, uniq


def _level_rows(level: str, frame: pl.DataFrame, col: str, steps: int) -> pl.DataFrame:
    return (frame.group_by(pl.col(col).fill_null("(none)").alias("name"))
            .agg((pl.col("in_situ") .sum() / steps).alias("in_situ_ms"),
                 (pl.col("projected").sum() / steps).alias("projected_ms"),
                 (pl.col("attainable").sum() / steps).alias("attainable_ms"))
            .with_columns(pl.lit(level).alias("level"),
                          (pl.col("projected_ms") / pl.col("in_situ_ms")).alias("efficiency")))


def project(run: Run | Path | str, threads: int | None = None,
            machine: MachineProfile | None = None, progress: ProgressFn | None = None, *,
            budget_s: float = 0.25, replay_ops: bool = True, replay: bool = True,
            write: bool = True, step_model: bool = True, replay_dtype: str | None = None) -> Projection:
    """Replay ``run``'s primitives and ops alone and project its step (see module doc).

    ``threads``: replay at this thread count (default: the Run's); ``machine``: the
    profile whose peaks the roofline and MFU use (default: this machine, measured and
    cached). ``replay=False`` measures nothing: every item counts at its in-situ time
    (roofline, MFU and what-ifs still work, e.g. for a Run from another machine).
    ``write``: store the tables in the Run (its HTML report then shows them).
    ``step_model``: also replay each PyTorch conv call whole and predict the step
    (``projected_step_ms``, see ``step_model.py``). ``replay_dtype`` ("bf16"): replay the
    conv calls and GEMM ops in that dtype instead of the captured one -- a measured dtype
    what-if on this machine (``whatif(..., replayed=...)``); the rest replays as captured.
    """
    run = run if isinstance(run, Run) else load_run(run)
    prims = _exec_primitives(run)
    ops = _replayable_ops(run) if replay_ops else pl.DataFrame()
    if prims.is_empty() and ops.is_empty():
        raise NoPrimitivesError(
            f"Run {run.path} has no oneDNN primitive and no framework op to replay "
            "(profile it without --light, with oneDNN enabled)")
    cores = cpu_topology().physical_cores
    captured_threads = run_threads(run)
    threads = int(threads or captured_threads)
    if threads < 1:
        raise InputError(f"--threads must be >= 1, not {threads}")
    if threads > cores:
        raise InputError(f"cannot replay at {threads} threads on {cores} cores here; "
                         "use a what-if (--machine FILE) to project beyond this machine")
    machine = machine or get_machine()
    steps, measured_step = _steps(run)

    unique = unique_primitives(prims) if not prims.is_empty() else pl.DataFrame()
    pcases, unique = _prim_cases(unique) if not unique.is_empty() else ([], unique)
    ocases, uops = _unique_ops(ops)
    all_ops = run.table(OPS) if step_model and run.has_table(OPS) else pl.DataFrame()
    ccases, calls = conv_calls(all_ops, prims) if step_model else ([], pl.DataFrame())
    if replay_dtype:
        in_dtype(replay_dtype, ccases, ocases, uops)
    if replay:
        env = {k: str(v) for k, v in (run.fingerprint.get("env") or {}).items()
               if k.startswith(("OMP_", "KMP_", "GOMP_")) and k != "OMP_NUM_THREADS"}
        cold = replay_cache(cached_machine() or (machine if machine.source == "measured" else None),
                            cpu_topology(), threads,
                            step_footprint_bytes(run.table(OPS), steps) if run.has_table(OPS) else None)
        result = run_worker(pcases + ocases + ccases, threads, progress=progress, budget_s=budget_s,
                            env=env, evict_bytes=cold.bytes)
        # at another thread count: the ops once more at the Run's own, for their calibration
        at_a = run_worker(ocases, captured_threads, budget_s=budget_s, env=env, evict_bytes=cold.bytes) \
            if step_model and ocases and threads != captured_threads <= cores else None
    else:
        at_a = cold = None
        result = ReplayResult(cases={}, log=pl.DataFrame(), threads=threads)

    # -- primitives --------------------------------------------------------------------
    if not unique.is_empty():
        ptab = match_primitives(unique, result).with_columns(
            (pl.col("calls") / steps).alias("calls_per_step"),
            (pl.col("in_situ_total_ms") / steps).alias("in_situ_total_ms"),
            pl.col("src_dt").map_elements(cfg_dtype, return_dtype=pl.Utf8).alias("dtype"),
        )
        ptab = add_roofline(ptab, machine, threads)
        ptab = ptab.with_columns(
            (pl.col("calls_per_step") * pl.coalesce("replay_ms", "in_situ_ms")).alias("projected_ms"))
    else:
        ptab = pl.DataFrame()

    # -- framework ops -----------------------------------------------------------------
    if not uops.is_empty():
        wall, errs = [], []
        for cid in uops["case_id"].to_list():
            res = result.cases.get(cid) or {}
            wall.append(result.wall_ms(cid))
            errs.append(f"replay failed: {res['error']}" if res.get("error") else None)
        otab = uops.with_columns(
            pl.Series("replay_ms", wall, dtype=pl.Float64),
            pl.coalesce(pl.Series("_err", errs, dtype=pl.Utf8), pl.col("note")).alias("note"),
            (pl.col("calls") / steps).alias("calls_per_step"),
            (pl.col("in_situ_total_ms") / steps).alias("in_situ_total_ms"),
        )
        otab = add_roofline(otab, machine, threads).with_columns(
            (pl.col("calls_per_step") * pl.coalesce("replay_ms", "in_situ_ms")).alias("projected_ms"))
    else:
        otab = pl.DataFrame()

    # -- row-level attribution (module, phase) -----------------------------------------
    frames = []
    if not ptab.is_empty():
        keys = [k for k in PRIM_KEY if k in prims.columns]
        per = ptab.select(*keys, "replay_ms", "attainable_ms")
        rows = prims.join(per, on=keys, how="left", nulls_equal=True)
        frames.append(rows.select(
            pl.col("driver"), pl.col("module") if "module" in rows.columns else pl.lit(None, pl.Utf8).alias("module"),
            pl.col("phase") if "phase" in rows.columns else pl.lit(None, pl.Utf8).alias("phase"),
            pl.col("time_ms").alias("in_situ"),
            pl.coalesce("replay_ms", "time_ms").alias("projected"),
            pl.col("attainable_ms").fill_null(0.0).alias("attainable")))
    nested = nested_calls(run.table(OP_EVENTS)) if run.has_table(OP_EVENTS) else None
    if nested is not None and nested.is_empty():
        nested = None
    # per ops key: the calls another replayed item already holds (nesting.py), once
    out = taken_out(nested, otab) if nested is not None and not otab.is_empty() else None
    if not otab.is_empty():
        per = otab.select("op", "input_shapes", "dtypes", "replay_ms", "attainable_ms", "in_situ_ms")
        rows = ops.join(per, on=["op", "input_shapes", "dtypes"], how="left", nulls_equal=True)
        # a call inside a replayed op (clamp_min_ in relu_) is in that op's replay already
        covered = pl.lit(0)
        if out is not None:
            keys = [k for k in OPS_KEY if k in rows.columns]
            cov = out.group_by(keys).agg(pl.col("covered_calls").sum())
            rows = rows.join(cov, on=keys, how="left", nulls_equal=True)
            covered = pl.col("covered_calls").fill_null(0)
        frames.append(rows.select(
            pl.format("aten:{}", pl.col("family")).alias("driver"), pl.col("module"), pl.col("phase"),
            pl.col("self_time_ms").alias("in_situ"),
            ((pl.col("calls") - covered) * pl.coalesce("replay_ms", "in_situ_ms")).alias("projected"),
            (pl.col("calls") * pl.col("attainable_ms").fill_null(0.0)).alias("attainable")))
    allrows = pl.concat(frames, how="vertical_relaxed")
    breakdown = pl.concat([_level_rows("driver", allrows, "driver", steps),
                           _level_rows("layer", allrows, "module", steps),
                           _level_rows("phase", allrows, "phase", steps)], how="vertical_relaxed"
                          ).select("level", "name", "in_situ_ms", "projected_ms", "efficiency",
                                   "attainable_ms")

    summary, assumptions = _summary(ptab, otab, allrows, steps, measured_step, machine, threads,
                                    captured_threads, native_conv_flops_by_dtype(ccases, calls, steps))
    summary["replayed"] = bool(replay)
    if replay_dtype:
        summary["replay_dtype"] = replay_dtype
        assumptions.append(f"conv calls and GEMM ops replayed in {replay_dtype} (as autocast runs them); "
                           "other ops replayed as captured")
    if cold is not None:
        summary["replay_cache"] = cold.to_dict()
        assumptions.append(f"cold replays evict {cold.bytes / 2**20:.0f} MiB before each call: {cold.detail}")
    step = pl.DataFrame()
    if step_model and run.has_table(STEPS):
        calls = attach_conv_replay(calls, result if replay else None, steps)
        if out is not None:
            otab = otab.join(per_unique_op(out, steps),
                             on=["op", "input_shapes", "dtypes"], how="left", nulls_equal=True)
        calibration = native_calibration(otab, {c["id"]: at_a.wall_ms(c["id"]) for c in ocases}) \
            if at_a is not None else pl.DataFrame()
        step = step_parts(run.table(STEPS), all_ops, prims, ptab,
                          calibrate_ops(otab, calibration), calls, nested)
        summary.update(step_summary(step, calls))
        if not calibration.is_empty():
            summary["native_calibration"] = calibration.to_dicts()
            assumptions.append(
                f"native kernels at {threads} thread(s): cold replay x in-situ/replay ratio per "
                f"op family measured at the Run's {captured_threads} ("
                + ", ".join(f"{f} {x:.2f}" + ("" if used else " not applied: outside "
                                                   f"{CALIBRATION_BOUNDS[0]}-{CALIBRATION_BOUNDS[1]}, "
                                                   "a disturbed replay")
                            for f, x, used in calibration.select("family", "factor", "used").iter_rows())
                + "), assumed not to depend on the thread count")
        assumptions.append(
            f"projected_step_ms: the step model (mean over {steps} step(s)): kernel parts "
            f"replayed at {threads} thread(s), other ops and Python gaps as measured")
    if not replay:
        assumptions.insert(0, "no replay: every item counts at its in-situ time")
    proj = Projection(ptab, otab, breakdown, summary, assumptions, run.path, step, calls)
    if write:
        proj.save(run)
    return proj


def in_dtype(dtype: str, conv_cases: list[dict], op_cases: list[dict], uops: pl.DataFrame) -> None:
    """Conv call cases and GEMM op cases (fp32 ones) set to replay in ``dtype``, as autocast
    would run them: the conv's input, weight and output gradient, a GEMM's operands."""
    cfg = ONEDNN_DTYPE.get(dtype)  # "bf16" -> oneDNN's "bf16"
    if cfg is None or cfg == "f32":
        raise InputError(f"cannot replay in {dtype!r}: bf16 or fp16")
    aten = PROFILER_DTYPE[dtype]  # and the profiler's "c10::BFloat16"
    for case in conv_cases:
        if case.get("dtype", "f32") == "f32":
            case["dtype"] = cfg
    gemm = set(uops.filter(pl.col("family") == "gemm")["case_id"].to_list()) if not uops.is_empty() else set()
    for case in op_cases:
        if case["id"] in gemm:
            case["dtypes"] = [aten if d == "float" else d for d in case["dtypes"]]


def _sum(df: pl.DataFrame, expr: pl.Expr) -> float:
    return float(df.select(expr.sum()).item() or 0.0) if not df.is_empty() else 0.0


def _summary(ptab: pl.DataFrame, otab: pl.DataFrame, allrows: pl.DataFrame, steps: int,
             measured_step: float | None, machine: MachineProfile, threads: int,
             captured_threads: int, native_conv_flops: Mapping[str, float] | None = None
             ) -> tuple[dict[str, Any], list[str]]:
    in_situ_kernel = float(allrows["in_situ"].sum()) / steps
    projected = float(allrows["projected"].sum()) / steps
    attainable = float(allrows["attainable"].sum()) / steps
    replayed_in_situ = (_sum(ptab.filter(pl.col("replay_ms").is_not_null()) if not ptab.is_empty()
                             else ptab, pl.col("in_situ_total_ms"))  # no oneDNN rows: BF16 without native BF16
                        + _sum(otab.filter(pl.col("replay_ms").is_not_null()) if not otab.is_empty()
                               else otab, pl.col("in_situ_total_ms")))
    flops = flops_by_dtype(ptab, otab)
    for d, f in (native_conv_flops or {}).items():  # convs no oneDNN primitive counted
        flops[d] = flops.get(d, 0.0) + f
    model_flops = sum(flops.values())
    peaks = peaks_by_dtype(machine, threads)
    peak = machine.gemm_peak_gflops("fp32", threads)
    matched = ptab.filter(pl.col("same_impl").is_not_null()) if not ptab.is_empty() else ptab
    summary = {
        "measured_step_ms": measured_step,
        "in_situ_kernel_ms": in_situ_kernel,
        "projected_kernel_ms": projected,
        "efficiency": projected / measured_step if measured_step else None,
        "kernel_efficiency": projected / in_situ_kernel if in_situ_kernel else None,
        "attainable_step_ms": attainable,
        "roofline_efficiency": attainable / measured_step if measured_step else None,
        "framework_ms": (measured_step - in_situ_kernel) if measured_step else None,
        "model_flops_per_step": model_flops,
        **summary_fields(flops, peaks, measured_step),  # flops/peak_gflops_by_dtype, mfu
        "coverage": replayed_in_situ / in_situ_kernel if in_situ_kernel else None,
        "threads": threads,
        "captured_threads": captured_threads,
        "steps": steps,
        "primitives": ptab.height,
        "primitives_replayed": int(ptab["replay_ms"].is_not_null().sum()) if not ptab.is_empty() else 0,
        "same_impl": int(matched["same_impl"].sum()) if not matched.is_empty() else 0,
        "impl_checked": matched.height,
        "ops": otab.height,
        "ops_replayed": int(otab["replay_ms"].is_not_null().sum()) if not otab.is_empty() else 0,
        "machine": machine.name,
        "gemm_peak_gflops": peak,
        "bandwidth_gbs": machine.bandwidth_at(threads),
    }
    assumptions = [
        "oneDNN primitives: replay time is oneDNN's own verbose time of the matching "
        "primitive in the replay (same clock as in situ); the PyTorch call's wall time is "
        "kept as replay_wall_ms",
        "framework ops: replay time is the wall time of the aten call at the recorded "
        "shapes; in situ is the profiler's self time",
        "items not replayed count at their in-situ time (coverage says how much was replayed)",
        "efficiency = projected kernel time / measured step time; the rest of the step is "
        "framework overhead, Python and unreplayed work",
        "roofline: compulsory bytes; FLOPs of framework ops other than GEMMs are a model",
        mfu_assumption(flops, peaks, machine.name),
    ]
    if threads != captured_threads:
        assumptions.append(f"replayed at {threads} threads; the Run was captured at {captured_threads}")
    assumptions += machine.assumptions
    return summary, assumptions


def require_projection(run: Run) -> Projection:
    proj = load_projection(run)
    if proj is None:
        raise RunError(f"Run {run.path} has no projection; run `profilednn project {run.path}` first")
    return proj


__all__ = ["Projection", "load_projection", "project", "require_projection", "run_threads"]

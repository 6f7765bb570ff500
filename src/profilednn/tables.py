"""The catalogue of a Run's tables: each table's name, the job that writes it, and its columns.

Writers pass a ``Table`` to ``Run.write_table`` (which checks the columns readers rely on),
readers and the report ask the catalogue which tables a job owns, and the tests' synthetic
Runs build their frames from these schemas, so a name or a column is spelled in one place.
A ``schema`` of ``None`` means the table's columns are documented by its owner (they
follow the job's result object); ``required`` are the columns every reader may rely on.

The ``steps`` table has one ``<phase>_ms`` column per phase of a training step
(``vocabulary.PHASES``, where the phases are defined once; ``tables.PHASES`` is the same).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from .verbose.schema import CAPTURE_SCHEMA, PRIMITIVE_SCHEMA
from .vocabulary import PHASES

PHASE_COLUMNS: tuple[str, ...] = tuple(f"{phase}_ms" for phase in PHASES)

JOBS: tuple[str, ...] = ("capture", "projection", "optimize", "memory", "pipeline", "distributed")


@dataclass(frozen=True, eq=False)
class Table:
    """One Run table: its file name (``<name>.parquet``), owning job, columns and meaning.
    Each table is one catalogue object, compared and hashed by identity."""

    name: str
    owner: str
    description: str
    schema: dict[str, pl.DataType] | None = None
    required: tuple[str, ...] = field(default=())

    def __str__(self) -> str:
        return self.name

    def empty(self) -> pl.DataFrame:
        """A frame with no rows and this table's columns (``schema`` must be set)."""
        if self.schema is None:
            raise ValueError(f"table {self.name!r} has no catalogued schema (see its owner, {self.owner})")
        return pl.DataFrame(schema=self.schema)

    def frame(self, rows: list[dict[str, object]]) -> pl.DataFrame:
        """``rows`` as a frame of this table's schema; columns a row leaves out are null."""
        if self.schema is None:
            raise ValueError(f"table {self.name!r} has no catalogued schema (see its owner, {self.owner})")
        return pl.DataFrame([{c: row.get(c) for c in self.schema} for row in rows], schema=self.schema)

    def missing_columns(self, df: pl.DataFrame) -> list[str]:
        """The required columns ``df`` lacks (none for a frame with no columns at all: the
        job had nothing of this kind to write, e.g. no framework ops in a verbose-only Run)."""
        if df.width == 0:
            return []
        return [c for c in self.required if c not in df.columns]


# --------------------------------------------------------------------------- capture
STEPS_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64, "time_ms": pl.Float64, "loss": pl.Float64,
    **{column: pl.Float64 for column in PHASE_COLUMNS}, "allocations": pl.Int64, "mapped_alloc_mib": pl.Float64,
}

PRIMITIVES = Table("primitives", "capture", "one row per oneDNN primitive execution (verbose line)",
                   {**PRIMITIVE_SCHEMA, **CAPTURE_SCHEMA}, ("driver", "time_ms"))
OPS = Table("ops", "capture", "framework ops aggregated per (op, module, phase, shapes, dtypes, step)", {
    "op": pl.Utf8, "calls": pl.Int64, "self_time_ms": pl.Float64, "module": pl.Utf8, "module_type": pl.Utf8,
    "phase": pl.Utf8, "input_shapes": pl.Utf8, "dtypes": pl.Utf8, "total_time_ms": pl.Float64,
    "onednn_ms": pl.Float64, "step": pl.Int64,
}, ("op", "calls", "self_time_ms"))
OP_EVENTS = Table("op_events", "capture", "every framework op call with its start and duration", {
    "op": pl.Utf8, "start_ms": pl.Float64, "dur_ms": pl.Float64, "self_ms": pl.Float64, "tid": pl.Int64,
    "depth": pl.Int64, "input_shapes": pl.Utf8, "dtypes": pl.Utf8, "module": pl.Utf8, "module_type": pl.Utf8,
    "phase": pl.Utf8, "step": pl.Int64,
}, ("op", "start_ms", "dur_ms"))
LAYERS = Table("layers", "capture", "time per module and phase per step", {
    "module": pl.Utf8, "module_type": pl.Utf8, "phase": pl.Utf8, "calls": pl.Int64, "time_ms": pl.Float64,
    "params": pl.Int64, "trainable_params": pl.Int64, "leaf": pl.Boolean, "step": pl.Int64,
    "faults": pl.Int64,  # minor page faults inside the module's calls (null: not counted)
}, ("module", "phase", "time_ms"))
LAYER_REFERENCE = Table("layer_reference", "capture", "the layers table of a full capture's light reference: "
                        "the warm-up steps after the first, observed without torch.profiler (verbose and "
                        "markers only); its ``step`` numbers those steps from 0", LAYERS.schema, LAYERS.required)
STEPS = Table("steps", "capture", "one row per measured training step: wall time, loss, time per phase, "
              "allocations and the MiB of them above glibc's 32 MiB mmap threshold (written by capture, and by "
              "optimize and distributed for their own steps; "
              "columns a producer does not measure are null)", STEPS_SCHEMA, ("time_ms",))
SPANS = Table("spans", "capture", "phase and module intervals on the step timeline", {
    "kind": pl.Utf8, "name": pl.Utf8, "module_type": pl.Utf8, "phase": pl.Utf8, "step": pl.Int64,
    "start_ms": pl.Float64, "end_ms": pl.Float64, "depth": pl.Int64,
    "faults": pl.Int64,  # minor page faults inside the span (null: not counted)
}, ("kind", "name", "start_ms", "end_ms"))

# --------------------------------------------------------------------------- projection
# The projection's tables carry the Run's own columns (a primitive's decoded verbose fields,
# an op's shapes) plus the replay's and the roofline's, documented in docs/projection.md;
# ``required`` are those the terminal, the report, what-ifs and engine comparisons read.
_PROJECTED = ("case_id", "calls", "calls_per_step", "in_situ_ms", "replay_ms", "projected_ms")
PROJECTION_PRIMITIVES = Table("projection_primitives", "projection", "per-primitive projected times", None,
                              ("driver", "prop_kind", "problem", "impl", *_PROJECTED, "attainable_ms", "bound"))
PROJECTION_OPS = Table("projection_ops", "projection", "per-op projected times", None,
                       ("op", "input_shapes", "dtypes", "family", *_PROJECTED, "attainable_ms", "bound"))
PROJECTION_BREAKDOWN = Table("projection_breakdown", "projection", "projected time by driver, layer and phase",
                             None, ("level", "name", "in_situ_ms", "projected_ms", "efficiency", "attainable_ms"))
PROJECTION_STEP = Table("projection_step", "projection", "the whole-step model per phase and part", None,
                        ("phase", "part", "in_situ_ms", "projected_ms", "calls", "assumption"))
PROJECTION_CONV_CALLS = Table("projection_conv_calls", "projection", "convolution calls the projection replays",
                              None, ("op", "input_shapes", "dtypes", "modules", "in_situ_path", "replay_path",
                                     *_PROJECTED))

# --------------------------------------------------------------------------- optimize
_RECIPE_FLOATS = ("before_ms", "after_ms", "speedup", "b_wins", "first_step_ms", "loss_max_rel_diff",
                  "grad_rel_diff", "worst_param_rel_diff", "estimated_gain_pct", "measured_gain_pct",
                  "speedup_lo", "speedup_hi", "measured_gain_lo", "measured_gain_hi")
_RECIPE_DTYPES = {"applies": pl.Boolean, "accepted": pl.Boolean, "rounds": pl.Int64}
OPTIMIZE_RECIPES = Table("optimize_recipes", "optimize", "one row per recipe: applies or why not, before/after "
                         "ms, speedup and its interval (speedup_lo/hi; measured_gain_lo/hi: the gain in percent "
                         "at those bounds), paired rounds, numerics verdict, accepted, outcome (accepted, "
                         "rejected, inconclusive, skipped)", {
    column: pl.Float64 if column in _RECIPE_FLOATS else _RECIPE_DTYPES.get(column, pl.Utf8)
    for column in ("recipe", "family", "applies", "reason", "accepted", "outcome", "decision", "measured_in",
                   "before_ms", "after_ms", "before_spread", "after_spread", "speedup", "speedup_lo",
                   "speedup_hi", "rounds", "b_wins", "first_step_ms", "numerics", "loss_max_rel_diff",
                   "grad_rel_diff", "worst_param", "worst_param_rel_diff", "numerics_detail", "tolerance",
                   "estimated_gain_pct", "measured_gain_pct", "measured_gain_lo", "measured_gain_hi")
}, ("recipe", "accepted"))
OPTIMIZE_SAMPLES = Table("optimize_samples", "optimize", "every timed A/B sample: recipe (or total), arm "
                         "(before/after), sample index, ms", {
    "recipe": pl.Utf8, "arm": pl.Utf8, "sample": pl.Int64, "time_ms": pl.Float64,
}, ("recipe", "arm", "time_ms"))
OPTIMIZE_HEADROOM = Table("optimize_headroom", "optimize", "the optimized step split by op family (profiled "
                          "after the final A/B): ms per step, share of the step, heaviest ops; the GEMM/conv "
                          "row's efficiency against the measured GEMM peaks", {
    "family": pl.Utf8, "description": pl.Utf8, "ms_per_step": pl.Float64, "share_pct": pl.Float64,
    "top_ops": pl.Utf8, "efficiency": pl.Float64,
}, ("family", "ms_per_step", "share_pct"))

# --------------------------------------------------------------------------- memory
MEMORY_LAYERS = Table("memory_layers", "memory", "predicted and measured bytes per layer", {
    "module": pl.Utf8, "module_type": pl.Utf8, "params_bytes": pl.Int64, "grad_bytes": pl.Int64,
    "optimizer_state_bytes": pl.Int64, "saved_predicted_bytes": pl.Int64,
    "saved_measured_bytes": pl.Int64, "workspace_bytes": pl.Int64, "io_bytes": pl.Int64,
}, ("module",))
MEMORY_SUMMARY = Table("memory_summary", "memory", "quantity, predicted bytes, measured bytes", {
    "quantity": pl.Utf8, "predicted_bytes": pl.Int64, "measured_bytes": pl.Int64,
}, ("quantity", "predicted_bytes", "measured_bytes"))
MEMORY_BUDGET = Table("memory_budget", "memory", "the batch-size search against a memory budget", {
    "batch_size": pl.Int64, "stage": pl.Utf8, "predicted_peak_bytes": pl.Int64,
    "measured_peak_bytes": pl.Int64, "budget_bytes": pl.Int64, "fits": pl.Boolean,
}, ("batch_size",))
MEMORY_TRADEOFF = Table("memory_tradeoff", "memory", "none / offload / checkpoint / both: peak and step time", {
    "config": pl.Utf8, "checkpoint_policy": pl.Utf8, "device": pl.Utf8, "batch_size": pl.Int64,
    "saved_device_bytes": pl.Int64, "offloaded_bytes": pl.Int64, "peak_bytes": pl.Int64,
    "peak_vs_none": pl.Float64, "step_ms": pl.Float64, "step_ms_min": pl.Float64,
    "step_ms_max": pl.Float64, "slowdown_vs_none": pl.Float64, "loss": pl.Float64,
}, ("config", "peak_bytes", "step_ms"))

# --------------------------------------------------------------------------- pipeline
PIPELINE_STAGES = Table("pipeline_stages", "pipeline", "one row per pipeline stage", {
    "stage": pl.Int64, "device": pl.Utf8, "layers": pl.Int64, "first_layer": pl.Utf8,
    "last_layer": pl.Utf8, "params_bytes": pl.Int64, "activation_bytes_per_microbatch": pl.Int64,
    "predicted_ms": pl.Float64, "busy_ms": pl.Float64, "max_in_flight": pl.Int64,
    "max_weight_versions": pl.Int64,
}, ("stage", "device", "layers"))
PIPELINE_STEPS = Table("pipeline_steps", "pipeline", "one row per pipeline mini-batch", {
    "step": pl.Int64, "loss": pl.Float64, "wall_ms": pl.Float64, "items_per_s": pl.Float64,
}, ("step", "loss", "wall_ms"))

# --------------------------------------------------------------------------- distributed
DIST_STEPS = Table("dist_steps", "distributed", "this rank's steps: compute vs communication", {
    "rank": pl.Int64, "step": pl.Int64, "time_ms": pl.Float64, "loss": pl.Float64,
    "data_ms": pl.Float64, "forward_ms": pl.Float64, "backward_ms": pl.Float64,
    "optimizer_ms": pl.Float64, "allreduce_ms": pl.Float64, "exposed_comm_ms": pl.Float64,
    "compute_ms": pl.Float64, "buckets": pl.Int64, "allreduce_bytes": pl.Int64,
}, ("rank", "step", "time_ms"))
DIST_RANK_STEPS = Table("dist_rank_steps", "distributed", "every rank's dist_steps, merged on rank 0",
                        DIST_STEPS.schema, DIST_STEPS.required)
DIST_RANKS = Table("dist_ranks", "distributed", "one row per rank: median step, compute and communication "
                   "times after warm-up, how often it was the slowest, straggler", {
    "rank": pl.Int64, "steps": pl.Int64, "step_ms": pl.Float64, "compute_ms": pl.Float64,
    "allreduce_ms": pl.Float64, "exposed_comm_ms": pl.Float64, "data_ms": pl.Float64,
    "step_min_ms": pl.Float64, "step_max_ms": pl.Float64, "allreduce_bytes": pl.Float64,
    "slowest_steps": pl.Int64, "comm_share": pl.Float64, "slowdown": pl.Float64, "straggler": pl.Boolean,
}, ("rank", "step_ms", "compute_ms", "straggler"))
DIST_COMM = Table("dist_comm", "distributed", "allreduce timings per message size (alpha-beta fit input)", {
    "bytes": pl.Int64, "ranks": pl.Int64, "median_s": pl.Float64, "min_s": pl.Float64, "max_s": pl.Float64,
    "repeats": pl.Int64,
}, ("bytes", "ranks", "median_s"))
DIST_PROJECTION = Table("dist_projection", "distributed", "projected data-parallel scaling per node count", {
    "nodes": pl.Int64, "ranks": pl.Int64, "global_batch": pl.Int64, "compute_ms": pl.Float64,
    "allreduce_ms": pl.Float64, "exposed_comm_ms": pl.Float64, "step_ms": pl.Float64,
    "items_per_s": pl.Float64, "speedup": pl.Float64, "efficiency": pl.Float64,
}, ("nodes", "step_ms", "items_per_s"))
SCALE = Table("scale", "distributed", "measured scaling over ranks x threads", {
    "mode": pl.String, "ranks": pl.Int64, "threads": pl.Int64, "cores_used": pl.Int64,
    "local_batch": pl.Int64, "global_batch": pl.Int64, "step_ms": pl.Float64, "compute_ms": pl.Float64,
    "allreduce_ms": pl.Float64, "exposed_comm_ms": pl.Float64, "items_per_s": pl.Float64,
    "normalized": pl.Float64, "efficiency": pl.Float64, "job_id": pl.String, "rank0_run": pl.String,
}, ("ranks", "step_ms"))
CONVERGENCE = Table("convergence", "distributed", "epochs (median over seeds) to reach the target accuracy "
                    "at each global batch, and the ratio to the smallest batch that reached it", {
    "global_batch": pl.Int64, "lr": pl.Float64, "steps_per_epoch": pl.Int64, "epochs_to_target": pl.Int64,
    "steps_to_target": pl.Int64, "seeds_reached": pl.Int64, "best_accuracy": pl.Float64,
    "convergence_ratio": pl.Float64,
}, ("global_batch", "epochs_to_target"))

TABLES: dict[str, Table] = {t.name: t for t in (
    PRIMITIVES, OPS, OP_EVENTS, LAYERS, LAYER_REFERENCE, STEPS, SPANS,
    PROJECTION_PRIMITIVES, PROJECTION_OPS, PROJECTION_BREAKDOWN, PROJECTION_STEP, PROJECTION_CONV_CALLS,
    OPTIMIZE_RECIPES, OPTIMIZE_SAMPLES, OPTIMIZE_HEADROOM,
    MEMORY_LAYERS, MEMORY_SUMMARY, MEMORY_BUDGET, MEMORY_TRADEOFF,
    PIPELINE_STAGES, PIPELINE_STEPS,
    DIST_STEPS, DIST_RANK_STEPS, DIST_RANKS, DIST_COMM, DIST_PROJECTION, SCALE, CONVERGENCE,
)}
"""Every table a ProfileDNN job writes, by name."""

CAPTURE_TABLES: tuple[Table, ...] = (PRIMITIVES, OPS, OP_EVENTS, LAYERS, STEPS, SPANS)


def tables_of(owner: str) -> tuple[Table, ...]:
    """The tables job ``owner`` writes, in catalogue order."""
    if owner not in JOBS:
        raise ValueError(f"unknown job {owner!r}: one of {', '.join(JOBS)}")
    return tuple(t for t in TABLES.values() if t.owner == owner)


def steps_frame(rows: list[dict[str, object]]) -> pl.DataFrame:
    """A ``steps`` table from per-step rows; what a producer did not measure is null."""
    return STEPS.frame(rows)


__all__ = [
    "CAPTURE_TABLES", "CONVERGENCE", "DIST_COMM", "DIST_PROJECTION", "DIST_RANKS", "DIST_RANK_STEPS",
    "DIST_STEPS", "JOBS", "LAYERS", "LAYER_REFERENCE", "MEMORY_BUDGET", "MEMORY_LAYERS", "MEMORY_SUMMARY",
    "MEMORY_TRADEOFF",
    "OPS", "OPTIMIZE_HEADROOM", "OPTIMIZE_RECIPES", "OPTIMIZE_SAMPLES", "OP_EVENTS", "PHASES", "PHASE_COLUMNS",
    "PIPELINE_STAGES", "PIPELINE_STEPS", "PRIMITIVES", "PROJECTION_BREAKDOWN", "PROJECTION_CONV_CALLS",
    "PROJECTION_OPS", "PROJECTION_PRIMITIVES", "PROJECTION_STEP", "SCALE", "SPANS", "STEPS", "STEPS_SCHEMA",
    "TABLES", "Table", "steps_frame", "tables_of",
]

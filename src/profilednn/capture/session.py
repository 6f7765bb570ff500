"""A capture session: one Run, one observation window, one set of tables.

The session owns the Run from creation to its final status. It opens the observation
window (verbose stream at fd 1, oneDNN verbose on, ``torch.profiler`` unless ``light``),
counts steps, closes the window after the measured steps, and turns what it saw into
``primitives``, ``ops``, ``op_events``, ``layers``, ``steps`` and ``spans`` tables.
Whatever happens to the workload, the Run ends ``complete``, ``failed`` or
``interrupted`` with everything captured so far.
"""

from __future__ import annotations

import os
import time
import traceback
from pathlib import Path
from typing import Any

import polars as pl
import torch

from ..errors import ProfileDNNError
from ..interrupts import hold_interrupts
from ..run import Run, create_run, final_status, finish_run
from ..tables import LAYERS, OPS, OP_EVENTS, PHASES, PRIMITIVES, SPANS, STEPS
from ..verbose.markers import read_markers, write_marker
from .attribute import (
    Timeline,
    attribute_by_time,
    attribute_primitives,
    build_timeline,
    innermost_ops,
)
from .fingerprint import fingerprint
from .hooks import Instrumentation
from .stream import VerboseTap, forward_foreign_lines, quiet_profiler_noise

LOG_NAME = "verbose.log"
PARTIAL_LOG = ".verbose.log.partial"


def _set_onednn_verbose(level: int) -> None:
    setter = getattr(getattr(torch._C, "_verbose", None), "mkldnn_set_verbose", None)
    if setter is None:
        raise ProfileDNNError("this torch build cannot switch oneDNN verbose mode at run time")
    setter(level)


class _StopAfterWindow(BaseException):
    """Raised from the step hook once the measured steps are captured, when the session
    was asked to stop there (``profile --stop-after``). A ``BaseException`` so that the
    script's own ``except Exception`` does not swallow it; the script runner catches it
    and ends the Run ``complete``."""

    def __init__(self, steps: int) -> None:
        super().__init__(f"stopped after {steps} steps")
        self.steps = steps


def stop_after_note(steps: int, warmup: int, measured: int) -> str:
    """The Run's note for a script stopped once its window was captured."""
    return (f"the script was stopped after {steps} steps ({warmup} warm-up + {measured} measured), "
            "once the measured steps were captured (--stop-after); the rest of it did not run")


def compiled_note(regions: list[str], *, full: bool) -> str:
    """What a user must know when part of the model ran as torch.compile graphs."""
    where = ("their generated kernels and the oneDNN primitives they call are attributed to "
             "phase and step" + (" and listed under the compiled graph's ops" if full else ""))
    return (f"torch.compile: {', '.join(regions)} ran as compiled graphs; each appears as one row "
            f"(forward and backward), {where}; per-layer attribution inside a compiled graph is "
            "not possible")


class CaptureSession:
    """Observe a training workload and write a Run."""

    def __init__(
        self,
        runs_dir: Path | str,
        *,
        label: str,
        command: list[str] | str | None,
        workload: dict[str, Any],
        warmup: int = 1,
        steps: int = 3,
        light: bool = False,
        auto_steps: bool = True,
        window_from_start: bool = False,
        stop_after: bool = False,
    ) -> None:
        if warmup < 0:
            raise ProfileDNNError(f"--warmup must be >= 0, not {warmup}")
        if steps is not None and steps < 1:
            raise ProfileDNNError(f"--steps must be >= 1, not {steps}")
        if stop_after and steps is None:
            raise ProfileDNNError("--stop-after needs a number of measured steps (--steps N)")
        self.warmup, self.steps, self.light = warmup, steps, light
        self.stop_after = stop_after
        self.window_from_start = window_from_start
        self.run: Run = create_run(
            runs_dir, label=label, command=command, workload=workload,
            capture={"light": light, "warmup": warmup, "steps": steps},
            notes=[],
        )
        self.inst = Instrumentation(on_step_end=self.step_end if auto_steps else None,
                                    on_backward=self._on_backward)
        self.tap = VerboseTap(self.run.path / PARTIAL_LOG)
        self.prof: torch.profiler.profile | None = None
        self.global_step = 0
        self.window_open = False
        self.window_done = False
        self.finished = False
        self.losses: dict[int, float] = {}
        self._t_start = time.perf_counter()

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        self.run.update(fingerprint=fingerprint())
        self.inst.install()
        if self.warmup == 0 or self.window_from_start:
            self.open_window()

    def __enter__(self) -> "CaptureSession":
        try:
            self.start()
        except BaseException as exc:  # the Run still ends, and says why
            self.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        """Finish the session as ``with create_run()`` finishes a Run: ``complete``,
        ``failed`` or ``interrupted`` with everything captured so far; the exception
        propagates with the Run hung on it as ``exc.run``."""
        if not self.finished:
            status, why = final_status(exc)
            with hold_interrupts():
                error = None if status == "complete" else exc  # sys.exit(0) is no error
                self.finish(status, error=error, exit_code=why.get("exit_code"))
        if exc is not None:
            finish_run(self.run, exc)  # already final: hangs the Run on the exception

    def open_window(self) -> None:
        if self.window_open or self.window_done:
            return
        if not self.light:
            self.prof = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU],
                record_shapes=True,
                profile_memory=True,
            )
            with quiet_profiler_noise():
                # torch warns once per process when a block allocated before profiling is
                # freed; free one here, where the warning is hidden, so it never shows later.
                primer = torch.empty(1)
                self.prof.start()
                del primer
        self.tap.open()
        self.window_open = True
        self.inst.active = True
        write_marker(f"win_open,{self.global_step}")
        _set_onednn_verbose(1)

    def close_window(self) -> None:
        if not self.window_open:
            return
        _set_onednn_verbose(0)
        write_marker("win_close")
        self.inst.active = False
        self.tap.close()
        if self.prof is not None:
            with quiet_profiler_noise():
                self.prof.stop()
        self.window_open = False
        self.window_done = True

    def step_end(self, loss: float | None = None) -> None:
        """End the current step (called by the optimizer hook or by the user).

        With ``stop_after``, the step that completes the window raises
        ``_StopAfterWindow`` once the window is closed (the verbose stream restored, the
        profiler stopped), so the workload stops there.
        """
        if self.window_open:
            write_marker(f"step_end,{self.global_step}")
            if loss is not None:
                self.losses[self.global_step] = float(loss)
        self.global_step += 1
        if not self.window_open and not self.window_done and self.global_step >= self.warmup:
            self.open_window()
        elif self.window_open and self.steps is not None and self.global_step >= self.warmup + self.steps:
            self.close_window()
            if self.stop_after:
                raise _StopAfterWindow(self.global_step)

    def record_loss(self, loss: Any) -> None:
        """Remember the loss of the current step (a tensor or a number)."""
        if self.window_open:
            value = loss.detach().float().item() if isinstance(loss, torch.Tensor) else float(loss)
            self.losses[self.global_step] = value

    def _on_backward(self, tensors: Any) -> None:
        """``loss.backward()`` on a scalar: that scalar is the step's loss."""
        if self.window_open and self.global_step not in self.losses:
            t = tensors[0] if isinstance(tensors, (list, tuple)) and tensors else tensors
            if isinstance(t, torch.Tensor) and t.numel() == 1:
                self.losses[self.global_step] = float(t.detach().float().item())

    @property
    def measured_steps(self) -> int:
        return max(0, self.global_step - self.warmup)

    # -- the end ------------------------------------------------------------------------
    def finish(
        self,
        status: str = "complete",
        *,
        error: BaseException | None = None,
        exit_code: int | None = None,
    ) -> Run:
        """Close everything, build the tables, and record the final status."""
        if self.finished:
            return self.run
        self.finished = True
        try:
            self.close_window()
        finally:
            self.inst.remove()
        fields: dict[str, Any] = {"wall_s": round(time.perf_counter() - self._t_start, 3)}
        if error is not None:
            fields["error"] = f"{type(error).__name__}: {error}"
            fields["traceback"] = "".join(traceback.format_exception(error))
        if exit_code is not None:
            fields["exit_code"] = exit_code
        if self.inst.fault is not None:
            fields["instrumentation_error"] = self.inst.fault
            last = self.inst.fault.strip().splitlines()[-1]
            self.note(f"ProfileDNN's instrumentation failed and stopped observing ({last}); the "
                      "program ran on unchanged; the traceback is in manifest.json")
        try:
            self._write_tables()
        except Exception as exc:  # keep the Run and say why the tables are missing
            fields.setdefault("error", f"building tables failed: {type(exc).__name__}: {exc}")
            fields["table_traceback"] = "".join(traceback.format_exception(exc))
            if status == "complete":
                status = "failed"
        self.run.set_status(status, **fields)
        return self.run

    def note(self, text: str) -> None:
        notes = list(self.run.manifest.get("notes") or [])
        notes.append(text)
        self.run.update(notes=notes)

    # -- tables -------------------------------------------------------------------------
    def _write_tables(self) -> None:
        from ..verbose import read_log_with_report

        partial = self.run.path / PARTIAL_LOG
        log = self.run.path / LOG_NAME
        if not partial.exists():
            self.note("the observation window never opened: no step reached the end of warm-up")
            return
        forwarded = forward_foreign_lines(partial)
        if forwarded:
            self.note(f"{forwarded} lines of workload output written at the C level were "
                      "captured with the verbose stream and printed after the run")
        os.replace(partial, log)

        markers = read_markers(log)
        module_types = {k: v["module_type"] for k, v in self.inst.names.info.items()}
        tl = build_timeline(markers, module_types)
        keep = self._measured_steps(tl)

        prims, report = read_log_with_report(log, allow_empty=True)
        self.run.update(parse_report=report.to_dict())
        prims = prims.filter(pl.col("event") == "exec")
        prims = attribute_primitives(prims, tl.states)
        prims = self._renumber(prims, keep)

        op_events = pl.DataFrame()
        allocations: dict[int, int] = {}
        if self.prof is not None:
            op_events, alloc_times = self._op_events()
            # An op takes the state at its midpoint: autograd's evaluate_function range
            # opens just before the gradient node's pre-hook writes its marker.
            op_events = attribute_by_time(
                op_events.with_columns((pl.col("start_ms") + pl.col("dur_ms") / 2).alias("mid_ms")),
                tl.states, "mid_ms",
            ).drop("mid_ms")
            op_events = self._with_module_type(op_events, module_types)
            prims = self._primitive_ops(prims, op_events)
            op_events = self._renumber(op_events, keep)
            if alloc_times:
                a = attribute_by_time(pl.DataFrame({"start_ms": alloc_times}), tl.states, "start_ms")
                a = self._renumber(a, keep)
                allocations = dict(a.group_by("step").len().iter_rows())
        else:
            prims = prims.with_columns(pl.lit(None, pl.Utf8).alias("op"))

        prims = prims.sort("line")
        self.run.write_table(PRIMITIVES, prims)
        spans = self._renumber(tl.spans, keep)
        self.run.write_table(SPANS, spans)
        self.run.write_table(LAYERS, self._layers(spans))
        self.run.write_table(STEPS, self._steps(spans, tl, keep, allocations))
        if self.prof is not None:
            self.run.write_table(OP_EVENTS, op_events)
            self.run.write_table(OPS, self._ops(op_events, prims))
        self.run.update(steps=len(keep), optimizers=list(self.inst.optimizers.values()))
        if not keep:
            self.note("no complete step was captured")
        if self.inst.compiled_regions:
            self.note(compiled_note(sorted(self.inst.compiled_regions), full=self.prof is not None))

    def _measured_steps(self, tl: Timeline) -> dict[int, int]:
        """Map global step index -> measured index (warm-up steps dropped)."""
        done = [g for g in tl.complete_steps if g >= self.warmup]
        if self.steps is not None:
            done = done[: self.steps]
        if not done:
            # No optimizer step in the window: the whole window is one step (wall time).
            if tl.step_bounds:
                g = max(tl.step_bounds)
                if self.inst.optimizer_steps == 0 and self.inst.auto_steps:
                    self.note("no optimizer.step() was seen: the whole run was profiled as one "
                              "step, timed by wall clock")
                return {g: 0}
            return {}
        return {g: i for i, g in enumerate(done)}

    @staticmethod
    def _renumber(df: pl.DataFrame, keep: dict[int, int]) -> pl.DataFrame:
        if df.is_empty() or "step" not in df.columns:
            return df
        mapping = pl.DataFrame({"step": list(keep), "_m": list(keep.values())},
                               schema={"step": pl.Int64, "_m": pl.Int64})
        return (df.join(mapping, on="step", how="inner").drop("step").rename({"_m": "step"}))

    @staticmethod
    def _with_module_type(df: pl.DataFrame, module_types: dict[str, str]) -> pl.DataFrame:
        if df.is_empty():
            return df.with_columns(pl.lit(None, pl.Utf8).alias("module_type"))
        return df.with_columns(
            pl.col("module").replace_strict(module_types, default=None, return_dtype=pl.Utf8)
            .alias("module_type")
        )

    def _op_events(self) -> tuple[pl.DataFrame, list[float]]:
        assert self.prof is not None
        results = self.prof.profiler.kineto_results
        base_ms = results.trace_start_ns() / 1e6
        # Every allocator call (frees have negative sizes); FunctionEvents only keep those
        # that happen outside any op, so read the raw kineto events.
        allocs = [e.start_ns() / 1e6 for e in results.events()
                  if e.name() == "[memory]" and e.nbytes() > 0]
        events = [e for e in self.prof.events() if not e.is_async]
        events = [e for e in events if e.name != "[memory]" and e.device_type.name == "CPU"]
        # Longest first on equal starts, so a parent always precedes its children.
        events.sort(key=lambda e: (e.time_range.start, -(e.time_range.end - e.time_range.start)))
        index = {id(e): i for i, e in enumerate(events)}
        depths: list[int] = []
        rows = []
        for e in events:
            parent = index.get(id(e.cpu_parent), -1) if e.cpu_parent is not None else -1
            # A parent starts before its children, so its depth is already known.
            depth = depths[parent] + 1 if parent >= 0 else 0
            depths.append(depth)
            rows.append((
                e.name,
                base_ms + e.time_range.start / 1000.0,
                (e.time_range.end - e.time_range.start) / 1000.0,
                e.self_cpu_time_total / 1000.0,
                int(e.thread),
                depth,
                parent,
                str(e.input_shapes) if e.input_shapes else "",
                str(e.input_dtypes) if getattr(e, "input_dtypes", None) else "",
            ))
        schema = {"op": pl.Utf8, "start_ms": pl.Float64, "dur_ms": pl.Float64, "self_ms": pl.Float64,
                  "tid": pl.Int64, "depth": pl.Int64, "parent": pl.Int64,
                  "input_shapes": pl.Utf8, "dtypes": pl.Utf8}
        df = pl.DataFrame(rows, schema=schema, orient="row").with_row_index("event_id")
        return df.with_columns(pl.col("event_id").cast(pl.Int64)), allocs

    @staticmethod
    def _primitive_ops(prims: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
        """Name each primitive's innermost containing framework op (by timestamp)."""
        if prims.is_empty() or ops.is_empty():
            return prims.with_columns(pl.lit(None, pl.Utf8).alias("op"),
                                      pl.lit(None, pl.Int64).alias("op_event"))
        main_tid = ops.group_by("tid").agg(pl.col("self_ms").sum()).sort("self_ms").row(-1)[0]
        ev = ops.filter(pl.col("tid") == main_tid).sort("start_ms")
        ids = ev["event_id"].to_list()
        pos = {eid: i for i, eid in enumerate(ids)}
        parent_pos = [pos.get(p, -1) for p in ev["parent"].to_list()]
        starts = ev["start_ms"].to_list()
        ends = [s + d for s, d in zip(starts, ev["dur_ms"].to_list())]
        idx = innermost_ops(prims["timestamp_ms"].to_list(), starts, ends, parent_pos)
        names = ev["op"].to_list()
        return prims.with_columns(
            pl.Series("op", [names[i] if i >= 0 else None for i in idx], dtype=pl.Utf8),
            pl.Series("op_event", [ids[i] if i >= 0 else None for i in idx], dtype=pl.Int64),
        )

    @staticmethod
    def _ops(op_events: pl.DataFrame, prims: pl.DataFrame) -> pl.DataFrame:
        keys = ["op", "module", "module_type", "phase", "input_shapes", "dtypes", "step"]
        if op_events.is_empty():
            return pl.DataFrame(schema={**{k: pl.Utf8 for k in keys[:-1]}, "step": pl.Int64,
                                        "calls": pl.UInt32, "self_time_ms": pl.Float64,
                                        "total_time_ms": pl.Float64, "onednn_ms": pl.Float64})
        onednn = (prims.filter(pl.col("op_event").is_not_null())
                  .group_by("op_event").agg(pl.col("time_ms").sum().alias("onednn_ms"))
                  .rename({"op_event": "event_id"}))
        ev = op_events.join(onednn, on="event_id", how="left").with_columns(pl.col("onednn_ms").fill_null(0.0))
        return (ev.group_by(keys).agg(
            pl.len().alias("calls"),
            pl.col("self_ms").sum().alias("self_time_ms"),
            pl.col("dur_ms").sum().alias("total_time_ms"),
            pl.col("onednn_ms").sum().alias("onednn_ms"),
        ).sort(["step", "self_time_ms"], descending=[False, True]))

    def _layers(self, spans: pl.DataFrame) -> pl.DataFrame:
        info = self.inst.names.info
        mods = spans.filter(pl.col("kind") == "module").with_columns(
            (pl.col("end_ms") - pl.col("start_ms")).alias("time_ms"))
        mod_rows = mods.group_by(["name", "module_type", "phase", "step"]).agg(
            pl.len().alias("calls"), pl.col("time_ms").sum())
        phases = spans.filter((pl.col("kind") == "phase") & pl.col("phase").is_in(["loss", "optimizer", "data"]))
        phase_rows = (phases.with_columns((pl.col("end_ms") - pl.col("start_ms")).alias("time_ms"))
                      .group_by(["name", "phase", "step"]).agg(pl.len().alias("calls"), pl.col("time_ms").sum())
                      .with_columns(pl.col("name").alias("module_type")))
        df = pl.concat([mod_rows.select("name", "module_type", "phase", "step", "calls", "time_ms"),
                        phase_rows.select("name", "module_type", "phase", "step", "calls", "time_ms")],
                       how="vertical_relaxed").rename({"name": "module"})
        meta = pl.DataFrame(
            [(k, v["params"], v["trainable_params"], v["leaf"]) for k, v in info.items()],
            schema={"module": pl.Utf8, "params": pl.Int64, "trainable_params": pl.Int64, "leaf": pl.Boolean},
            orient="row",
        )
        df = df.join(meta, on="module", how="left").with_columns(
            pl.col("calls").cast(pl.Int64),
            pl.col("params").fill_null(0), pl.col("trainable_params").fill_null(0),
            pl.col("leaf").fill_null(True),
        )
        return df.select("module", "module_type", "phase", "calls", "time_ms", "params",
                         "trainable_params", "leaf", "step").sort(["step", "phase", "time_ms"],
                                                                  descending=[False, False, True])

    def _steps(self, spans: pl.DataFrame, tl: Timeline, keep: dict[int, int],
               allocations: dict[int, int]) -> pl.DataFrame:
        per_phase: dict[tuple[int, str], float] = {
            (st, ph): d for st, ph, d in (
                spans.filter(pl.col("kind") == "phase")
                .group_by(["step", "phase"]).agg((pl.col("end_ms") - pl.col("start_ms")).sum())
                .iter_rows())
        }
        rows = []
        for g, m in sorted(keep.items(), key=lambda kv: kv[1]):
            start, end = tl.step_bounds.get(g, (None, None))
            row: dict[str, Any] = {"step": m, "time_ms": (end - start) if start is not None else None,
                                   "loss": self.losses.get(g)}
            row.update({f"{ph}_ms": per_phase.get((m, ph), 0.0) for ph in PHASES})
            row["allocations"] = allocations.get(m) if self.prof is not None else None
            rows.append(row)
        return STEPS.frame(rows)


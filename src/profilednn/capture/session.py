"""A capture session: one Run, one observation window, one set of tables.

The session owns the Run from creation to its final status. It opens the observation
window (verbose stream at fd 1, oneDNN verbose on, ``torch.profiler`` unless ``light``),
counts steps, closes the window after the measured steps, and turns what it saw into
``primitives``, ``ops``, ``op_events``, ``layers``, ``steps`` and ``spans`` tables
(``capture_tables.py``, one function per table). A full capture also observes the warm-up
steps after the first light (no ``torch.profiler``): their ``layer_reference`` table says
which layers' times the full window inflated (``step_summary.layer_inflation``).
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
from ..step_summary import inflation_note, layer_inflation, reference_steps, step_stats
from ..tables import LAYER_REFERENCE, LAYERS, OPS, OP_EVENTS, PRIMITIVES, SPANS, STEPS
from ..verbose.markers import STEP_END, WIN_CLOSE, WIN_OPEN, read_markers
from .attribute import Timeline, attribute_primitives, build_timeline
from .capture_tables import (
    allocations_per_step,
    attributed_events,
    layers_table,
    ops_table,
    primitive_ops,
    profiler_events,
    renumber,
    steps_table,
)
from .fingerprint import fingerprint
from .hooks import Instrumentation
from .page_faults import MANIFEST_KEY as PAGE_FAULTS, FaultCounter, write_capture_marker
from .resident import growth_note, resident_bytes, window_record
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


def evaluation_note(calls: int, ms: float) -> str:
    """What the Run says of evaluation or sampling calls inside its measured steps."""
    return (f"{calls} forward calls of the trained model under torch.no_grad() (evaluation, sampling) "
            f"ran inside the measured steps ({ms:.1f} ms): they count in their step's time and its "
            "'other' phase, in no layer (oneDNN verbose was off for them)")


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
        provisional_start: bool = False,
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
        # A script's window opens at its start in case it never steps; its first step in
        # warm-up drops what that window saw (``_drop_provisional``).
        self.provisional_start = provisional_start and warmup > 0 and not window_from_start
        self._provisional = False
        # A full capture observes the warm-up steps after the first (the cold one) light:
        # verbose and markers, no torch.profiler. Their per-layer times are the reference
        # that says which layers' times the full window inflated (``_take_reference``).
        self.light_reference = not light and not window_from_start and warmup >= 2
        self._referencing = False
        self.reference: pl.DataFrame | None = None  # the reference's layers table
        self.run: Run = create_run(
            runs_dir, label=label, command=command, workload=workload,
            capture={"light": light, "warmup": warmup, "steps": steps},
            notes=[],
        )
        self.inst = Instrumentation(on_step_end=self.step_end if auto_steps else None,
                                    on_backward=self._on_backward, on_eval=self._on_eval)
        self.tap = VerboseTap(self.run.path / PARTIAL_LOG)
        self.prof: torch.profiler.profile | None = None
        self.global_step = 0
        self.window_open = False
        self.window_done = False
        self.finished = False
        self.losses: dict[int, float] = {}
        self.faults = FaultCounter()
        self._forwarded = 0  # C-level output lines of the workload sent on to the terminal
        self._profiled: set[int] = set()  # the global steps torch.profiler watched
        # (global step, resident bytes, under torch.profiler) as each window opened and closed
        self._resident: list[tuple[int, int | None, bool]] = []
        self._t_start = time.perf_counter()

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        self.run.update(fingerprint=fingerprint())
        self.faults = FaultCounter()  # counts from here: the steps, not the imports and setup before
        self.inst.install()
        if self.warmup == 0 or self.window_from_start:
            self.open_window()
        elif self.provisional_start:
            # verbose and markers only: under torch 2.14 a profiler stopped and dropped with
            # its events unread crashed the process (a segfault) when garbage-collected
            self.open_window(profiler=False)
            self._provisional = True

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

    def open_window(self, *, profiler: bool = True) -> None:
        if self.window_open or self.window_done:
            return
        if not self.light and profiler:
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
        self._resident.append((self.global_step, resident_bytes(), self.prof is not None))
        self.tap.open()
        self.window_open = True
        self.inst.active = True
        write_capture_marker(f"{WIN_OPEN},{self.global_step}")
        _set_onednn_verbose(1)

    def close_window(self) -> None:
        if not self.window_open:
            return
        _set_onednn_verbose(0)
        write_capture_marker(WIN_CLOSE)
        self.inst.active = False
        self.tap.close()
        if self.prof is not None:
            with quiet_profiler_noise():
                self.prof.stop()
        self._resident.append((self.global_step, resident_bytes(), self.prof is not None))
        self.window_open = False
        self.window_done = True

    def step_end(self, loss: float | None = None) -> None:
        """End the current step (called by the optimizer hook or by the user).

        With ``stop_after``, the step that completes the window raises
        ``_StopAfterWindow`` once the window is closed (the verbose stream restored, the
        profiler stopped), so the workload stops there.
        """
        self.faults.step_end()
        if self.window_open:
            write_capture_marker(f"{STEP_END},{self.global_step}")
            if loss is not None:
                self.losses[self.global_step] = float(loss)
            if self.prof is not None:
                self._profiled.add(self.global_step)
        self.global_step += 1
        if self._provisional:
            self._drop_provisional()
        if self._referencing and self.global_step >= self.warmup:
            self._take_reference()
        elif self.light_reference and self.global_step == 1 < self.warmup and not self.window_open:
            self.open_window(profiler=False)
            self._referencing = True
        if not self.window_open and not self.window_done and self.global_step >= self.warmup:
            self.open_window()
        elif self.window_open and self.steps is not None and self.global_step >= self.warmup + self.steps:
            self.close_window()
            if self.stop_after:
                raise _StopAfterWindow(self.global_step)

    def _drop_provisional(self) -> None:
        """The script steps: drop what the window opened at its start saw (the first warm-up
        step and the set-up before it: log lines, markers), so nothing outside the measured
        steps stays in the log or memory; the window opens again at the end of warm-up."""
        self._provisional = False
        partial = self._drop_partial_window()
        if partial is not None:
            partial.unlink()

    def _drop_partial_window(self) -> Path | None:
        """Close the window and drop its log, the workload's own output in it printed: the
        window can open again. The log's path when there was one, for a last read."""
        self.close_window()
        self.window_done = False
        self.losses.clear()
        partial = self.run.path / PARTIAL_LOG
        if not partial.exists():
            return None
        self._forwarded += forward_foreign_lines(partial)
        return partial

    def _take_reference(self) -> None:
        """End the light observation of the warm-up: keep the layers table of its complete
        steps (numbered from 0) as the reference, drop its log; the full window opens next."""
        self._referencing = False
        partial = self._drop_partial_window()
        if partial is None:
            return
        module_types = {k: v["module_type"] for k, v in self.inst.names.info.items()}
        tl = build_timeline(read_markers(partial), module_types)
        keep = {g: i for i, g in enumerate(sorted(g for g in tl.complete_steps if g < self.warmup))}
        self.reference = layers_table(renumber(tl.spans, keep), self.inst.names.info)
        partial.unlink()

    def _on_eval(self, begin: bool) -> None:
        """A forward of the trained model under ``no_grad`` (evaluation, sampling) inside the
        window: oneDNN verbose is off for it (``hooks.py`` marks only its bounds). torch.profiler
        keeps recording (``toggle_collection_dynamic`` led to a segfault under torch 2.14), and the
        tables put those ops in the step's ``other`` phase, in no layer."""
        if self.window_open:
            _set_onednn_verbose(0 if begin else 1)

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
            if self._referencing:  # the run ended in warm-up: its light observation is dropped
                self._take_reference()
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
        """The capture tables (``capture_tables.py``, one function each) into the Run."""
        from ..verbose import read_log_with_report

        log = self._settle_log()
        if log is None:
            return
        module_types = {k: v["module_type"] for k, v in self.inst.names.info.items()}
        markers = read_markers(log)
        tl = build_timeline(markers, module_types)
        keep = self._measured_steps(tl)
        prims, report = read_log_with_report(log, allow_empty=True)
        self.run.update(parse_report=report.to_dict())
        prims = renumber(attribute_primitives(prims.filter(pl.col("event") == "exec"), tl.states), keep)
        op_events, allocations = pl.DataFrame(), None
        held = {"log_lines": report.lines, "markers": len(markers)}
        if self.prof is not None:
            events, allocs = profiler_events(self.prof)
            held.update(profiler_ops=events.height, allocator_records=len(allocs))
            events = attributed_events(events, tl, module_types)
            prims = primitive_ops(prims, events)
            op_events = renumber(events, keep)
            allocations = allocations_per_step(allocs, tl, keep)
        else:
            prims = prims.with_columns(pl.lit(None, pl.Utf8).alias("op"))

        prims = prims.sort("line")
        spans = renumber(tl.spans, keep)
        self.run.write_table(PRIMITIVES, prims)
        self.run.write_table(SPANS, spans)
        layers = layers_table(spans, self.inst.names.info)
        steps = steps_table(spans, tl, keep, self.losses, allocations)
        self.run.write_table(LAYERS, layers)
        self.run.write_table(STEPS, steps)
        if self.prof is not None:
            self.run.write_table(OP_EVENTS, op_events)
            self.run.write_table(OPS, ops_table(op_events, prims))
        # what the window held, in records: bounded by the window, not by the run's length
        self.run.update(steps=len(keep), optimizers=list(self.inst.optimizers.values()),
                        capture={**self.run.manifest.get("capture", {}), "events": held})
        self._write_reference(layers, steps)
        self._record_faults()
        if not keep:
            self.note("no complete step was captured")
        evals = spans.filter(pl.col("kind") == "eval")
        if evals.height:
            self.note(evaluation_note(evals.height, float((evals["end_ms"] - evals["start_ms"]).sum())))
        if self.inst.compiled_regions:
            self.note(compiled_note(sorted(self.inst.compiled_regions), full=self.prof is not None))

    def _write_reference(self, layers: pl.DataFrame, steps: pl.DataFrame) -> None:
        """The light reference's layers table, the layers whose time the full window inflated
        beyond it (``step_summary.layer_inflation``) in the manifest, and a note naming them."""
        if self.reference is None or self.prof is None:
            return
        self.run.write_table(LAYER_REFERENCE, self.reference)
        stats = step_stats(steps)
        if not stats:
            return
        light_steps = reference_steps(self.reference)
        inflation = layer_inflation(layers, self.reference, stats["median_ms"])
        inflated = inflation.filter(pl.col("inflated"))["module"].to_list()
        reference = {"steps": light_steps, "inflated": inflated}
        self.run.update(capture={**self.run.manifest.get("capture", {}), "light_reference": reference})
        note = inflation_note(inflation, light_steps)
        if note is not None:
            self.note(note)

    def _record_faults(self) -> None:
        """Page faults per step up to the window's end (``page_faults.py``)."""
        end = self.warmup + self.steps if self.steps is not None else self.global_step
        record = self.faults.record(self._profiled, end)
        if record is not None:
            self.run.update(**{PAGE_FAULTS: record})
        self._record_resident(record)

    def _record_resident(self, faults: dict[str, Any] | None) -> None:
        """The resident memory as torch.profiler's window opened and closed (and over the light
        reference's steps before it), and a note when it grew far (``resident.py``)."""
        profiled = [(step, rss) for step, rss, prof in self._resident if prof]
        if len(profiled) != 2:
            return
        (first, opened), (_, closed) = profiled
        # the light reference's window: its open and its close, as the profiled window opened
        before = [(step, rss) for step, rss, prof in self._resident if not prof and step <= first][-2:]
        unprofiled = None
        if self.reference is not None and len(before) == 2 and before[1][0] == first:
            (start, start_rss), (_, end_rss) = before
            unprofiled = (start_rss, end_rss, first - start)
        resident = window_record(opened, closed, len(self._profiled), unprofiled)
        if resident is None:
            return
        self.run.update(capture={**self.run.manifest.get("capture", {}), "resident": resident})
        if self.warmup == 0 or self.window_from_start:
            return  # the window held the first steps, whose first allocations are the script's own
        watched = [n for n, w in zip(faults["per_step"], faults["profiled"]) if w] if faults else []
        note = growth_note(resident, watched)
        if note is not None:
            self.note(note)

    def _settle_log(self) -> Path | None:
        """The verbose log under its final name, the workload's own C-level output printed
        (None when the window never opened)."""
        partial = self.run.path / PARTIAL_LOG
        if not partial.exists():
            self.note("the observation window never opened: no step reached the end of warm-up")
            return None
        forwarded = self._forwarded + forward_foreign_lines(partial)
        if forwarded:
            self.note(f"{forwarded} lines of workload output written at the C level were "
                      "captured with the verbose stream and printed after the run")
        log = self.run.path / LOG_NAME
        os.replace(partial, log)
        return log

    def _no_step_profiler_note(self) -> str:
        if self.light or self.prof is not None:
            return ""
        return ("; torch.profiler starts at the end of warm-up, so there is no op table "
                "(profile with --warmup 0 for one)")

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
                              "step, timed by wall clock" + self._no_step_profiler_note())
                return {g: 0}
            return {}
        return {g: i for i, g in enumerate(done)}

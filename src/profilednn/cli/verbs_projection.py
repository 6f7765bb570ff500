"""CLI verbs of the projection job: ``machine``, ``project``, ``engines``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .options import (
    ImageSize, ModelName, Oversubscribe, SeqLen, Threads, size_knobs, writable_dir, writable_file,
)
from .app import app, console, err_console, styled


def _json_out(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
    sys.stdout.flush()


def _bar() -> Progress:
    return Progress(TextColumn("{task.description}", style="bold", markup=False), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=err_console, transient=True)


def _fmt(v: Any, pct: bool = False) -> str:
    if v is None:
        return "n/a"
    if pct:
        return f"{100 * v:.1f}%"
    if isinstance(v, float):
        return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.1f}"
    return str(v)


@app.command("machine")
def machine_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="Print the profile as JSON.")] = False,
    refresh: Annotated[bool, typer.Option("--refresh", help="Measure again, ignoring the cache.")] = False,
    output: Annotated[Optional[Path], typer.Option("-o", "--output", callback=writable_file, help="Also write the profile as a machine TOML file (for what-ifs elsewhere).")] = None,
) -> None:
    """This machine's profile: cores, ISA, measured GEMM peak per dtype and thread count, bandwidth."""
    from ..projection.machine import cached_machine_path, get_machine

    with err_console.status("measuring the machine (GEMM peaks, memory bandwidth)") as status:
        prof = get_machine(refresh=refresh, progress=lambda msg: status.update(msg))
    if output is not None:
        prof.save(output)
    if as_json:
        _json_out(prof.to_dict())
        return
    console.print(styled(prof.name, "bold", f": {prof.cores} cores, {prof.sockets} socket(s), "
                         f"{prof.numa_nodes} NUMA node(s); ISA {', '.join(prof.isa) or 'n/a'}; "
                         f"native {', '.join(prof.native_dtypes)}"), highlight=False)
    t = Table(title=f"GEMM ({prof.gemm_size}^3 matmul), GFLOP/s; the peak is the best repeat")
    for col in ("dtype", "threads", "median", "min", "max (peak)", "repeats"):
        t.add_column(col, justify="right" if col not in ("dtype",) else "left")
    for dt, table in prof.gemm.items():
        for th, m in sorted(table.items()):
            t.add_row(dt, str(th), f"{m.median:.1f}", f"{m.min:.1f}", f"{m.max:.1f}", str(m.repeats))
    console.print(t)
    b = Table(title="Memory bandwidth (STREAM triad), GB/s; the ceiling is the best repeat")
    for col in ("threads", "median", "min", "max (ceiling)"):
        b.add_column(col, justify="right")
    for th, m in sorted(prof.bandwidth.items()):
        b.add_row(str(th), f"{m.median:.1f}", f"{m.min:.1f}", f"{m.max:.1f}")
    console.print(b)
    if prof.contended:
        err_console.print(styled("warning:", "yellow", f" other processes used {prof.background_load_pct:.0f}% "
                                 "of the CPUs while measuring; the peaks are likely low. Run "
                                 "`profilednn machine --refresh` on an idle machine."))
    console.print(f"cached: {cached_machine_path()}" + (f"; written: {output}" if output else ""),
                  highlight=False, soft_wrap=True)


def _print_projection(proj, top: int) -> None:
    import polars as pl

    s = proj.summary
    t = Table(title=f"Primitives and ops (top {top} by in-situ time per step)")
    t.add_column("item", overflow="ellipsis", no_wrap=True, max_width=64)
    for col in ("calls", "in_situ_ms", "replay_ms", "attainable_ms", "bound", "impl"):
        t.add_column(col, justify="left" if col in ("bound", "impl") else "right", no_wrap=True)
    rows = []
    if not proj.primitives.is_empty():
        for r in proj.primitives.iter_rows(named=True):
            impl = r["impl"] if r["same_impl"] in (True, None) else f"{r['impl']} -> {r['replay_impl']}"
            rows.append((r["in_situ_total_ms"], f"{r['driver']} {r['direction'] or ''} {r['problem']}",
                         r["calls_per_step"], r["in_situ_ms"], r["replay_ms"], r["attainable_ms"],
                         r["bound"], impl))
    if not proj.ops.is_empty():
        for r in proj.ops.iter_rows(named=True):
            rows.append((r["in_situ_total_ms"], f"{r['op']} {r['input_shapes']}"[:70],
                         r["calls_per_step"], r["in_situ_ms"], r["replay_ms"], r["attainable_ms"],
                         r["bound"], "native"))
    for row in sorted(rows, key=lambda x: -(x[0] or 0.0))[:top]:
        t.add_row(row[1], _fmt(row[2]), _fmt(row[3]), _fmt(row[4]), _fmt(row[5]), row[6] or "",
                  row[7] or "")
    console.print(t)
    d = Table(title="By driver (ms per step)")
    for col in ("driver", "in_situ_ms", "projected_ms", "efficiency", "attainable_ms"):
        d.add_column(col, justify="left" if col == "driver" else "right")
    for r in proj.by_driver.iter_rows(named=True):
        d.add_row(r["name"], _fmt(r["in_situ_ms"]), _fmt(r["projected_ms"]),
                  _fmt(r["efficiency"]), _fmt(r["attainable_ms"]))
    console.print(d)
    console.print(
        f"measured_step_ms {_fmt(s['measured_step_ms'])}  projected_kernel_ms "
        f"{_fmt(s['projected_kernel_ms'])}  efficiency {_fmt(s['efficiency'], True)}  "
        f"ceiling (roofline) {_fmt(s['attainable_step_ms'])} ms  mfu {_fmt(s['mfu'], True)}  "
        f"coverage {_fmt(s['coverage'], True)}  same impl {s['same_impl']}/{s['impl_checked']}",
        highlight=False, soft_wrap=True)
    if s.get("flops_by_dtype"):
        from ..projection.dtypes import format_flops, format_peaks

        console.print(f"model FLOPs per step: {format_flops(s['flops_by_dtype'])}; GEMM peaks: "
                      f"{format_peaks(s.get('peak_gflops_by_dtype'), s.get('gemm_peak_gflops'))} "
                      "(mfu holds each dtype against its own peak)", highlight=False, soft_wrap=True)
    mismatched = proj.primitives.filter(pl.col("same_impl") == False) if not proj.primitives.is_empty() else proj.primitives  # noqa: E712
    if mismatched.height:
        console.print(styled("note:", "yellow", " oneDNN picked another implementation in the replay for "
                             f"{mismatched.height} primitive(s) (see the note column)"))


def _print_step(proj) -> None:
    """The step model: one row per part with its assumption, then the step per phase."""
    from ..projection.step_model import by_part, by_phase

    s = proj.summary
    if proj.step.is_empty() or s.get("projected_step_ms") is None:
        return
    t = Table(title=f"Step model at {s.get('threads')} thread(s): ms per step (mean over "
                    f"{s.get('steps')} step(s))")
    for col in ("part", "in_situ_ms", "projected_ms", "calls", "us_per_call", "assumption"):
        t.add_column(col, justify="left" if col in ("part", "assumption") else "right",
                     overflow="fold")
    for r in by_part(proj.step).iter_rows(named=True):
        per_call = _fmt(r["us_per_call"]) if r["part"] == "other ops" and r["calls"] else ""
        t.add_row(r["part"], _fmt(r["in_situ_ms"]), _fmt(r["projected_ms"]),
                  _fmt(r["calls"]) if r["calls"] else "", per_call, r["assumption"] or "")
    console.print(t)
    phases = "  ".join(f"{r['phase']} {_fmt(r['in_situ_ms'])} -> {_fmt(r['projected_ms'])}"
                       for r in by_phase(proj.step).iter_rows(named=True))
    console.print(f"per phase (ms): {phases}", highlight=False, soft_wrap=True)
    console.print(styled(
        f"projected_step_ms {_fmt(s['projected_step_ms'])}", "bold",
        f" at {s.get('threads')} thread(s) (measured mean {_fmt(s.get('modeled_step_ms'))} ms "
        f"at {s.get('captured_threads')})"), highlight=False, soft_wrap=True)
    native_in, native_out = s.get("native_conv_in_situ_ms") or 0.0, s.get("native_conv_projected_ms") or 0.0
    if native_in or native_out or s.get("conv_calls_switching_path"):
        console.print(f"  native ATen convolutions (instead of oneDNN): {_fmt(native_in)} ms in situ, "
                      f"{_fmt(native_out)} ms projected; {s.get('conv_calls_switching_path', 0)} "
                      "conv call(s) change path at the target (see the conv_calls table)",
                      highlight=False, soft_wrap=True)


def _print_validation(v) -> None:
    s = v.summary
    for title, tab, key in (("Per phase", v.by_phase, "phase"), ("Per part", v.by_part, "part")):
        t = Table(title=f"{title}: A {s['a']} -> B {s['b']} (ms per step, means)")
        for col in (key, "measured_a_ms", "predicted_b_ms", "measured_b_ms", "error"):
            t.add_column(col, justify="left" if col == key else "right")
        for r in tab.iter_rows(named=True):
            t.add_row(str(r[key]), _fmt(r["measured_a_ms"]), _fmt(r["predicted_b_ms"]),
                      _fmt(r["measured_b_ms"]), _fmt(r["error"], True))
        console.print(t)
    console.print(
        f"own step at A: projected {_fmt(s['own_projected_step_ms'])} ms, measured "
        f"{_fmt(s['measured_a_step_ms'])} ms ({_fmt(s['own_error'], True)}); step at B: predicted "
        f"{_fmt(s['predicted_b_step_ms'])} ms, measured {_fmt(s['measured_b_step_ms'])} ms "
        f"({_fmt(s['error'], True)}); Run at B: {s['run_b']}", highlight=False, soft_wrap=True)


def _print_whatif(w) -> None:
    s = w.summary
    console.print(styled(
        "what-if", "bold", f" {s['target_machine']} at {s['target_threads']} thread(s), dtype "
        f"{s['dtype']}" + (f", speedups {s['driver_speedup']}" if s["driver_speedup"] else "")
        + f": step {_fmt(s['measured_step_ms'])} -> {_fmt(s['whatif_step_ms'])} ms "
        f"({_fmt(s['speedup'])}x)" + (f"; projected_step_ms {_fmt(s['projected_step_ms'])}"
                                      if s.get("projected_step_ms") is not None else "")),
        highlight=False, soft_wrap=True)
    for a in w.assumptions:
        console.print(f"  assumes: {a}", highlight=False, soft_wrap=True)


@app.command("project")
def project_cmd(
    run: Annotated[Path, typer.Argument(help="The Run directory to project.")],
    threads: Annotated[Optional[int], typer.Option(help="Replay at this thread count (default: the Run's). With --machine: the target's thread count.")] = None,
    machine: Annotated[Optional[Path], typer.Option(help="What-if: project the step to the machine described by this TOML file (`profilednn machine -o`).")] = None,
    dtype: Annotated[Optional[str], typer.Option(help="What-if: run conv/ip/matmul in this dtype (bf16) on the target; refused where it is not native.")] = None,
    driver_speedup: Annotated[Optional[list[str]], typer.Option("--driver-speedup", help="What-if: DRIVER=K, that driver K times faster (repeatable; e.g. conv=2, aten:norm=1.5).")] = None,
    no_replay: Annotated[bool, typer.Option("--no-replay", help="Measure nothing: items count at their in-situ time (roofline, MFU, what-ifs still work).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the projection (and what-if) as JSON.")] = False,
    top: Annotated[int, typer.Option(help="Rows in the primitive table.")] = 20,
    validate: Annotated[bool, typer.Option("--validate", help="Prove the what-if: profile the Run's built-in workload at --threads/--dtype and compare predicted with measured step, per phase and part.")] = False,
    runs_dir: Annotated[Path, typer.Option(callback=writable_dir, help="With --validate: where the Run at the target goes.")] = Path("runs"),
) -> None:
    """Replay each primitive and op of a Run alone; efficiency, roofline, MFU, what-ifs.

    Adds its tables to the Run (projection_primitives, projection_ops,
    projection_breakdown) and a Projection section to `profilednn report RUN`.
    """
    from ..projection import load_machine_file, project, whatif
    from ..projection.machine import get_machine
    from ..run import load_run

    if validate:
        from ..projection.validate import validate as validate_run

        if machine is not None or driver_speedup:
            raise typer.BadParameter("--validate checks --threads/--dtype what-ifs on this machine")
        with err_console.status("validating") as status:
            v = validate_run(run, threads=threads, dtype=dtype, runs_dir=runs_dir,
                             progress=lambda msg: status.update(msg))
        if as_json:
            _json_out(v.to_dict())
        else:
            _print_validation(v)
        return
    target = load_machine_file(machine) if machine is not None else None
    the_run = load_run(run)
    here = get_machine()
    replay_threads = None if target is not None else threads
    with _bar() as bar:
        task = bar.add_task("replaying primitives and ops", total=None)
        proj = project(the_run, threads=replay_threads, machine=here, replay=not no_replay,
                       progress=lambda i, n: bar.update(task, completed=i, total=n))
    what = None
    if target is not None or dtype or driver_speedup:
        what = whatif(proj, threads=threads if target is not None else None, machine=target,
                      dtype=dtype, driver_speedup=driver_speedup, source=here)
    if as_json:
        out = proj.to_dict()
        if what is not None:
            out["whatif"] = what.to_dict()
        _json_out(out)
        return
    _print_projection(proj, top)
    _print_step(proj)
    if what is not None:
        _print_whatif(what)
    console.print(f"tables written to {the_run.path} (see `profilednn report {the_run.path}`)",
                  highlight=False, soft_wrap=True)


@app.command("engines")
def engines_cmd(
    model: ModelName,
    batch_size: Annotated[Optional[int], typer.Option(help="Batch size.")] = None,
    image_size: ImageSize = None,
    seq_len: SeqLen = None,
    steps: Annotated[int, typer.Option(help="Measured steps per engine.")] = 2,
    warmup: Annotated[int, typer.Option(help="Warm-up steps per engine.")] = 1,
    threads: Threads = None,
    oversubscribe: Oversubscribe = False,
    runs_dir: Annotated[Path, typer.Option(callback=writable_dir, help="Where the two Runs go.")] = Path("runs"),
    as_json: Annotated[bool, typer.Option("--json", help="Print the comparison as JSON.")] = False,
    top: Annotated[int, typer.Option(help="Layers shown.")] = 20,
) -> None:
    """Seed 001's engine comparison: the same workload with oneDNN on and off, per layer and phase."""
    from ..projection import compare_engines

    knobs = size_knobs(batch_size=batch_size, image_size=image_size, seq_len=seq_len)
    with _bar() as bar:
        task = bar.add_task("oneDNN on", total=warmup + steps)

        def tick(engine: str, done: int, total: int) -> None:
            bar.update(task, description=f"oneDNN {'on' if engine == 'onednn' else 'off'}",
                       completed=done, total=total)
        cmp = compare_engines(model, runs_dir=runs_dir, steps=steps, warmup=warmup,
                              threads=threads, progress=tick, **knobs)
    if as_json:
        _json_out(cmp.to_dict())
        return
    t = Table(title="Per phase (ms, median step)")
    for col in ("phase", "onednn_ms", "native_ms", "speedup"):
        t.add_column(col, justify="left" if col == "phase" else "right")
    for r in cmp.by_phase.iter_rows(named=True):
        t.add_row(r["phase"], _fmt(r["onednn_ms"]), _fmt(r["native_ms"]), _fmt(r["speedup"]))
    console.print(t)
    lt = Table(title=f"Per layer (top {top} by native time)")
    for col in ("module", "type", "phase", "onednn_ms", "native_ms", "speedup"):
        lt.add_column(col, justify="right" if col.endswith(("ms", "speedup")) else "left")
    for r in cmp.by_layer.head(top).iter_rows(named=True):
        lt.add_row(r["module"] or "", r["module_type"] or "", r["phase"] or "", _fmt(r["onednn_ms"]),
                   _fmt(r["native_ms"]), _fmt(r["speedup"]))
    console.print(lt)
    s = cmp.summary
    console.print(f"step: oneDNN {_fmt(s['onednn_step_ms'])} ms, native {_fmt(s['native_step_ms'])} ms "
                  f"-> oneDNN is {_fmt(s['speedup'])}x; Runs: "
                  + ", ".join(f"{k} {v}" for k, v in cmp.runs.items()), highlight=False, soft_wrap=True)

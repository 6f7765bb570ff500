"""CLI verbs of the projection job: ``machine``, ``project``, ``engines``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..formatting import print_json
from .options import (
    BatchSize, ImageSize, ModelName, Oversubscribe, SeqLen, Threads, Wide, size_knobs, writable_dir, writable_file,
)
from .app import app, console, err_console, styled
from .progress import progress_bar


@app.command("machine")
def machine_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="Print the profile as JSON.")] = False,
    refresh: Annotated[bool, typer.Option("--refresh", help="Measure again, ignoring the cache.")] = False,
    output: Annotated[Optional[Path], typer.Option(
        "-o", "--output", callback=writable_file,
        help="Also write the profile as a machine TOML file (for what-ifs elsewhere).")] = None,
) -> None:
    """This machine's profile: cores, ISA, measured GEMM peak per dtype and thread count, bandwidth."""
    from ..projection.api import cached_machine_path, checked_machine, get_machine, probe_history
    from ..projection.terminal import print_machine, print_machine_drift

    with err_console.status("measuring the machine (GEMM peaks, memory bandwidth)") as status:
        prof = get_machine(refresh=refresh, progress=lambda msg: status.update(msg))
        if not refresh:  # a probe now, at all cores: is the cache still this machine?
            status.update("probing the machine (a small GEMM per dtype and a triad)")
            check = checked_machine(prof.cores, machine=prof)
    if output is not None:
        prof.save(output)
    if as_json:
        print_json({**prof.to_dict(), "probe_history": probe_history()})
        return
    print_machine(prof, console)
    print_machine_drift(prof, probe_history(), console)
    if not refresh and check.note:
        err_console.print(styled("note:", "yellow", f" {check.note}"), highlight=False)
    if prof.contended:
        err_console.print(styled("warning:", "yellow", f" other processes used {prof.background_load_pct:.0f}% "
                                 "of the CPUs while measuring; the peaks are likely low. Run "
                                 "`profilednn machine --refresh` on an idle machine."))
    console.print(f"cached: {cached_machine_path()}" + (f"; written: {output}" if output else ""),
                  highlight=False, soft_wrap=True)


@app.command("project")
def project_cmd(
    run: Annotated[Path, typer.Argument(help="The Run directory to project.")],
    threads: Annotated[Optional[int], typer.Option(
        help="Replay at this thread count (default: the Run's). With --machine: the target's thread count.")] = None,
    machine: Annotated[Optional[Path], typer.Option(
        help="What-if: project the step to the machine described by this TOML file (`profilednn machine -o`).")] = None,
    dtype: Annotated[Optional[str], typer.Option(
        help="What-if: run conv/ip/matmul in this dtype (bf16) on the target; refused where it is not native.")] = None,
    driver_speedup: Annotated[Optional[list[str]], typer.Option(
        "--driver-speedup",
        help="What-if: DRIVER=K, that driver K times faster (repeatable; e.g. conv=2, aten:norm=1.5).")] = None,
    no_replay: Annotated[bool, typer.Option(
        "--no-replay",
        help="Measure nothing: items count at their in-situ time (roofline, MFU, what-ifs still work).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the projection (and what-if) as JSON.")] = False,
    top: Annotated[int, typer.Option(help="Rows in the primitive table.")] = 20,
    validate: Annotated[bool, typer.Option(
        "--validate",
        help="Prove the what-if: profile the Run's built-in workload at --threads/--dtype and compare predicted with "
             "measured step, per phase and part.")] = False,
    runs_dir: Annotated[Path, typer.Option(
        callback=writable_dir, help="With --validate: where the Run at the target goes.")] = Path("runs"),
    wide: Wide = False,
) -> None:
    """Replay each primitive and op of a Run alone; efficiency, roofline, MFU, what-ifs.

    Adds its tables to the Run (projection_primitives, projection_ops,
    projection_breakdown) and a Projection section to `profilednn report RUN`.
    """
    from ..projection.api import get_machine, load_machine_file, project, whatif
    from ..projection.terminal import print_projection, print_step, print_validation, print_whatif
    from ..run import load_run

    if validate:
        from ..projection.api import validate as validate_run

        if machine is not None or driver_speedup:
            raise typer.BadParameter("--validate checks --threads/--dtype what-ifs on this machine")
        with err_console.status("validating") as status:
            v = validate_run(run, threads=threads, dtype=dtype, runs_dir=runs_dir,
                             progress=lambda msg: status.update(msg))
        if as_json:
            print_json(v.to_dict())
        else:
            print_validation(v, console)
        return
    target = load_machine_file(machine) if machine is not None else None
    the_run = load_run(run)
    replay_threads = None if target is not None else threads
    with progress_bar() as bar:  # project probes the cached machine first (hardware/drift.py)
        task = bar.add_task("replaying primitives and ops", total=None)
        proj = project(the_run, threads=replay_threads, replay=not no_replay,
                       progress=lambda i, n: bar.update(task, completed=i, total=n))
    here = proj.machine_used or get_machine()
    if proj.summary.get("machine_check") == "scaled":
        err_console.print(styled("note:", "yellow", f" {proj.summary['machine_note']}"), highlight=False)
    what = replayed = None
    if dtype and target is None and not no_replay:  # this machine: measure the dtype, don't scale
        from ..projection.api import require_faster_dtype

        require_faster_dtype(here, dtype)
        with progress_bar() as bar:
            task = bar.add_task(f"replaying conv calls and GEMM ops in {dtype}", total=None)
            replayed = project(the_run, threads=replay_threads, machine=here, write=False, replay_dtype=dtype,
                               progress=lambda i, n: bar.update(task, completed=i, total=n))
    if target is not None or dtype or driver_speedup:
        what = whatif(proj, threads=threads if target is not None else None, machine=target,
                      dtype=dtype, driver_speedup=driver_speedup, source=here, replayed=replayed)
    if as_json:
        out = proj.to_dict()
        if what is not None:
            out["whatif"] = what.to_dict()
        print_json(out)
        return
    print_projection(proj, top, console, wide=wide)
    print_step(proj, console, wide=wide)
    if what is not None:
        print_whatif(what, console)
    console.print(f"tables written to {the_run.path} (see `profilednn report {the_run.path}`)",
                  highlight=False, soft_wrap=True)


@app.command("engines")
def engines_cmd(
    model: ModelName,
    batch_size: BatchSize = None,
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
    from ..projection.api import compare_engines
    from ..projection.terminal import print_engines

    knobs = size_knobs(batch_size=batch_size, image_size=image_size, seq_len=seq_len)
    with progress_bar() as bar:
        task = bar.add_task("oneDNN on", total=warmup + steps)

        def tick(engine: str, done: int, total: int) -> None:
            bar.update(task, description=f"oneDNN {'on' if engine == 'onednn' else 'off'}",
                       completed=done, total=total)
        cmp = compare_engines(model, runs_dir=runs_dir, steps=steps, warmup=warmup,
                              threads=threads, progress=tick, **knobs)
    if as_json:
        print_json(cmp.to_dict())
        return
    print_engines(cmp, top, console)

"""The projection job's terminal printer: the tables of ``machine``, ``project`` (projection,
step model, what-if, validation) and ``engines`` on a rich console.

(``report.py`` beside it holds the job's HTML section.) Tables keep their essential
columns in a terminal narrower than :data:`~profilednn.formatting.FULL_TABLE_WIDTH`;
``wide=True`` (the verbs' ``--wide``) shows every column anyway.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from ..formatting import full_tables, num, pct, print_table, styled
from ..topology import CpuTopology, isa_cap_note

if TYPE_CHECKING:
    from rich.console import Console

    from .engines import EngineComparison
    from ..hardware.machine import MachineProfile
    from .projector import Projection
    from .validate import Validation
    from .what_if import WhatIf


def print_machine(prof: MachineProfile, console: Console) -> None:
    """The machine's identity line, the dtypes faster than fp32, its GEMM peaks and bandwidth."""
    console.print(styled(prof.name, "bold", f": {prof.cores} cores, {prof.sockets} socket(s), "
                         f"{prof.numa_nodes} NUMA node(s); ISA {', '.join(prof.isa) or 'n/a'}; "
                         f"native {', '.join(prof.native_dtypes)}"), highlight=False)
    if prof.kernel_env:
        console.print("measured with " + " ".join(f"{k}={v}" for k, v in prof.kernel_env.items())
                      + (f" ({note})" if (note := isa_cap_note(prof.kernel_env)) else ""), highlight=False)
    faster = prof.faster_dtypes()
    console.print("faster than fp32: " + ("; ".join(f"{d} ({why})" for d, why in faster.items())
                                          or "none (fp32 is the fastest dtype here)"), highlight=False)
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
    if prof.cache_bytes:
        topo = prof.topology if isinstance(prof.topology, CpuTopology) else None
        said = f" (sysfs reports {topo.llc_bytes / 2**20:.0f} MiB)" if topo and topo.llc_bytes else ""
        console.print(f"cache the {prof.cores} core(s) reach: {prof.cache_bytes / 2**20:.0f} MiB, measured{said}; "
                      "cold replays evict that much", highlight=False)
    elif prof.cache_sweep:
        console.print(f"cache the cores reach: more than the sweep's {prof.cache_sweep[-1][0]:.0f} MiB",
                      highlight=False)
    if prof.page_fault_ms_per_mib is not None:
        console.print(f"first touch of freshly mapped memory (page faults, zeroing): {prof.page_fault_ms_per_mib:.3g} "
                      f"ms/MiB at {prof.cores} core(s), measured; the allocator advice counts it for every "
                      "buffer glibc maps afresh each step", highlight=False)


def print_machine_drift(prof: MachineProfile, history: list[dict], console: Console, last: int = 10) -> None:
    """When each figure was measured, the probe recorded with the peaks, and the last probes
    (each one's ratio to that reference: the machine's drift over time)."""
    from ..hardware.probe import TRIAD, ProbeReference

    when = prof.measured_at or ({"all figures": prof.measured} if prof.measured else {})
    console.print("measured: " + ("; ".join(f"{k.replace('_', ' ')} {str(v)[:16].replace('T', ' ')}"
                                            for k, v in when.items()) or "unknown (a hand-written file)"),
                  highlight=False, soft_wrap=True)
    ref = ProbeReference.from_dict(prof.probe_reference)
    if ref is None:
        console.print("probe reference: none recorded (`profilednn machine --refresh` measures one); jobs "
                      "cannot check this profile for drift", highlight=False, soft_wrap=True)
        return
    r = Table(title=f"Probe reference ({ref.gemm_n}^3 GEMM, {ref.triad_mib} MiB triad; median of {ref.rounds} "
                    "rounds; noise = rounds' range or IQR)")
    for col in ("threads", "kernel", "value", "noise"):
        r.add_column(col, justify="left" if col == "kernel" else "right")
    for th, figs in sorted(ref.by_threads.items()):
        for k, f in figs.items():
            unit = "GB/s" if k == TRIAD else "GFLOP/s"
            r.add_row(str(th), k, f"{f.value:,.1f} {unit}", f"{f.noise:.1%}")
    console.print(r)
    if not history:
        console.print("probes: none yet", highlight=False)
        return
    h = Table(title=f"Last probes (of {len(history)} kept): ratio to the reference")
    for col in ("taken", "threads", "ratios", "verdict"):
        h.add_column(col, justify="right" if col == "threads" else "left")
    for e in history[-last:]:
        ratios = ", ".join(f"{k} {v:.2f}x" for k, v in (e.get("ratios") or {}).items())
        h.add_row(str(e.get("taken", ""))[:16].replace("T", " "), str(e.get("threads", "")), ratios,
                  str(e.get("verdict", "")))
    console.print(h)


def _item_rows(proj: Projection) -> list[tuple]:
    """(in-situ total, item, calls, in-situ ms, replay ms, attainable ms, bound, impl) per
    primitive and op."""
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
    return rows


def print_projection(proj: Projection, top: int, console: Console, *, wide: bool = False) -> None:
    """The top primitives and ops, the per-driver table and the summary line."""
    import polars as pl

    full = full_tables(console, wide)
    s = proj.summary
    t = Table(title=f"Primitives and ops (top {top} by in-situ time per step)")
    t.add_column("item", overflow="ellipsis" if full else "fold", no_wrap=full, max_width=64)
    # narrow: in-situ, replay and bound; --wide adds calls, the roofline and the impl
    columns = (("calls", 2), ("in_situ_ms", 3), ("replay_ms", 4), ("attainable_ms", 5), ("bound", 6),
               ("impl", 7))
    shown = [(c, i) for c, i in columns if full or c in ("in_situ_ms", "replay_ms", "bound")]
    for col, _ in shown:
        t.add_column(col, justify="left" if col in ("bound", "impl") else "right", no_wrap=True)
    for row in sorted(_item_rows(proj), key=lambda x: -(x[0] or 0.0))[:top]:
        cells = [(row[i] or "") if col in ("bound", "impl") else num(row[i]) for col, i in shown]
        t.add_row(row[1], *cells)
    print_table(console, t, wide=wide)
    d = Table(title="By driver (ms per step)")
    for col in ("driver", "in_situ_ms", "projected_ms", "efficiency", "attainable_ms"):
        d.add_column(col, justify="left" if col == "driver" else "right")
    for r in proj.by_driver.iter_rows(named=True):
        d.add_row(r["name"], num(r["in_situ_ms"]), num(r["projected_ms"]),
                  num(r["efficiency"]), num(r["attainable_ms"]))
    console.print(d)
    console.print(
        f"measured_step_ms {num(s['measured_step_ms'])}  projected_kernel_ms "
        f"{num(s['projected_kernel_ms'])}  efficiency {pct(s['efficiency'])}  "
        f"ceiling (roofline) {num(s['attainable_step_ms'])} ms  mfu {pct(s['mfu'])}  "
        f"coverage {pct(s['coverage'])}  same impl {s['same_impl']}/{s['impl_checked']}",
        highlight=False, soft_wrap=True)
    if s.get("flops_by_dtype"):
        from ..hardware.dtypes import format_flops, format_peaks

        console.print(f"model FLOPs per step: {format_flops(s['flops_by_dtype'])}; GEMM peaks: "
                      f"{format_peaks(s.get('peak_gflops_by_dtype'), s.get('gemm_peak_gflops'))} "
                      "(mfu holds each dtype against its own peak)", highlight=False, soft_wrap=True)
    from ..hardware.drift import describe

    console.print(describe(proj.machine), highlight=False, soft_wrap=True)
    mismatched = proj.primitives.filter(pl.col("same_impl") == False) if not proj.primitives.is_empty() else proj.primitives  # noqa: E712
    if mismatched.height:
        console.print(styled("note:", "yellow", " oneDNN picked another implementation in the replay for "
                             f"{mismatched.height} primitive(s) (see the note column)"))


def print_step(proj: Projection, console: Console, *, wide: bool = False) -> None:
    """The step model: one row per part with its assumption, then the step per phase."""
    from .step_model import OTHER_OPS, by_part, by_phase

    s = proj.summary
    if proj.step.is_empty() or s.get("projected_step_ms") is None:
        return
    full = full_tables(console, wide)
    t = Table(title=f"Step model at {s.get('threads')} thread(s): ms per step (mean over "
                    f"{s.get('steps')} step(s))")
    # narrow: the part, its two times and its assumption; --wide adds the call counts
    columns = ("part", "in_situ_ms", "projected_ms", "calls", "us_per_call", "assumption") if full else \
        ("part", "in_situ_ms", "projected_ms", "assumption")
    for col in columns:
        t.add_column(col, justify="left" if col in ("part", "assumption") else "right",
                     overflow="fold", ratio=3 if col == "assumption" and not full else None)
    for r in by_part(proj.step).iter_rows(named=True):
        cells = {"part": r["part"], "in_situ_ms": num(r["in_situ_ms"]), "projected_ms": num(r["projected_ms"]),
                 "calls": num(r["calls"]) if r["calls"] else "",
                 "us_per_call": num(r["us_per_call"]) if r["part"] == OTHER_OPS and r["calls"] else "",
                 "assumption": r["assumption"] or ""}
        t.add_row(*(cells[c] for c in columns))
    print_table(console, t, wide=wide)
    phases = "  ".join(f"{r['phase']} {num(r['in_situ_ms'])} -> {num(r['projected_ms'])}"
                       for r in by_phase(proj.step).iter_rows(named=True))
    console.print(f"per phase (ms): {phases}", highlight=False, soft_wrap=True)
    console.print(styled(
        f"projected_step_ms {num(s['projected_step_ms'])}", "bold",
        f" at {s.get('threads')} thread(s) (measured mean {num(s.get('modeled_step_ms'))} ms "
        f"at {s.get('captured_threads')})"), highlight=False, soft_wrap=True)
    native_in, native_out = s.get("native_conv_in_situ_ms") or 0.0, s.get("native_conv_projected_ms") or 0.0
    if native_in or native_out or s.get("conv_calls_switching_path"):
        console.print(f"  native ATen convolutions (instead of oneDNN): {num(native_in)} ms in situ, "
                      f"{num(native_out)} ms projected; {s.get('conv_calls_switching_path', 0)} "
                      "conv call(s) change path at the target (see the conv_calls table)",
                      highlight=False, soft_wrap=True)


def print_validation(v: Validation, console: Console) -> None:
    """Predicted against measured, per phase and per part, then the step."""
    s = v.summary
    for title, tab, key in (("Per phase", v.by_phase, "phase"), ("Per part", v.by_part, "part")):
        t = Table(title=f"{title}: A {s['a']} -> B {s['b']} (ms per step, means)")
        for col in (key, "measured_a_ms", "predicted_b_ms", "measured_b_ms", "error"):
            t.add_column(col, justify="left" if col == key else "right")
        for r in tab.iter_rows(named=True):
            t.add_row(str(r[key]), num(r["measured_a_ms"]), num(r["predicted_b_ms"]),
                      num(r["measured_b_ms"]), pct(r["error"]))
        console.print(t)
    console.print(
        f"own step at A: projected {num(s['own_projected_step_ms'])} ms, measured "
        f"{num(s['measured_a_step_ms'])} ms ({pct(s['own_error'])}); step at B: predicted "
        f"{num(s['predicted_b_step_ms'])} ms, measured {num(s['measured_b_step_ms'])} ms "
        f"({pct(s['error'])}); Run at B: {s['run_b']}", highlight=False, soft_wrap=True)


def print_whatif(w: WhatIf, console: Console) -> None:
    """The what-if's step and the assumptions it rests on."""
    s = w.summary
    console.print(styled(
        "what-if", "bold", f" {s['target_machine']} at {s['target_threads']} thread(s), dtype "
        f"{s['dtype']}" + (f", speedups {s['driver_speedup']}" if s["driver_speedup"] else "")
        + f": step {num(s['measured_step_ms'])} -> {num(s['whatif_step_ms'])} ms "
        f"({num(s['speedup'])}x)" + (f"; projected_step_ms {num(s['projected_step_ms'])}"
                                     if s.get("projected_step_ms") is not None else "")),
        highlight=False, soft_wrap=True)
    if s.get("source_basis"):
        console.print(f"  from: {s['source_basis']}", highlight=False, soft_wrap=True)
    for a in w.assumptions:
        console.print(f"  assumes: {a}", highlight=False, soft_wrap=True)


def print_engines(cmp: EngineComparison, top: int, console: Console) -> None:
    """oneDNN on vs off: per phase, per layer, then the step."""
    t = Table(title="Per phase (ms, median step)")
    for col in ("phase", "onednn_ms", "native_ms", "speedup"):
        t.add_column(col, justify="left" if col == "phase" else "right")
    for r in cmp.by_phase.iter_rows(named=True):
        t.add_row(r["phase"], num(r["onednn_ms"]), num(r["native_ms"]), num(r["speedup"]))
    console.print(t)
    lt = Table(title=f"Per layer (top {top} by native time)")
    for col in ("module", "type", "phase", "onednn_ms", "native_ms", "speedup"):
        numeric = col.endswith(("ms", "speedup"))  # long module names fold, whole, in a narrow terminal
        lt.add_column(col, justify="right" if numeric else "left", overflow="fold", no_wrap=numeric)
    for r in cmp.by_layer.head(top).iter_rows(named=True):
        lt.add_row(r["module"] or "", r["module_type"] or "", r["phase"] or "", num(r["onednn_ms"]),
                   num(r["native_ms"]), num(r["speedup"]))
    console.print(lt)
    s = cmp.summary
    console.print(f"step: oneDNN {num(s['onednn_step_ms'])} ms, native {num(s['native_step_ms'])} ms "
                  f"-> oneDNN is {num(s['speedup'])}x; Runs: "
                  + ", ".join(f"{k} {v}" for k, v in cmp.runs.items()), highlight=False, soft_wrap=True)


__all__ = ["print_engines", "print_machine", "print_projection", "print_step", "print_validation",
           "print_whatif"]

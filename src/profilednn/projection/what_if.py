"""What-ifs: the step at another thread count, on another machine, in BF16, or with one
driver k times faster -- projected from a Run's projection with the roofline model.

The model (said in every result's ``assumptions``): each primitive keeps the fraction of
its roofline it reaches here. A compute-bound one scales with the GEMM peak (per dtype,
per thread count), a memory-bound one with the memory bandwidth; framework overhead
(the step minus its kernels: Python, dispatch, allocation) is single-threaded and stays
as measured. BF16 applies to conv/deconv/ip/matmul and GEMM ops (what autocast lowers)
and halves their bytes; a reduced dtype is projected only on a target where it pays
(:func:`require_faster_dtype`): emulated BF16 is many times slower, and a vector ISA alone
does not make it faster (fp16 on the Intel AMX guest ran below fp32). A driver k times faster follows Amdahl's law.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from ..errors import InputError
from ..hardware.machine import MachineProfile, get_machine, normalize_dtype
from ..vocabulary import COMPUTE_DRIVERS, CONV_DRIVERS
from .projector import Projection

BF16_DRIVERS = (*sorted(COMPUTE_DRIVERS), "aten:gemm")  # oneDNN's compute primitives and native GEMMs


@dataclass
class WhatIf:
    """One what-if: per-item times before/after, the step before/after, the assumptions."""

    items: pl.DataFrame
    summary: dict[str, Any]
    assumptions: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"summary": self.summary, "assumptions": self.assumptions,
                "by_driver": self.by_driver.to_dicts()}

    @property
    def by_driver(self) -> pl.DataFrame:
        return (self.items.group_by("driver")
                .agg(pl.col("in_situ_ms").sum(), pl.col("whatif_ms").sum())
                .with_columns((pl.col("in_situ_ms") / pl.col("whatif_ms")).alias("speedup"))
                .sort("in_situ_ms", descending=True))


def parse_speedups(specs: list[str] | dict[str, float] | None) -> dict[str, float]:
    """``["conv=2", "aten:norm=1.5"]`` -> ``{"conv": 2.0, "aten:norm": 1.5}``."""
    if not specs:
        return {}
    if isinstance(specs, dict):
        items = list(specs.items())
    else:
        items = []
        for spec in specs:
            name, sep, value = str(spec).partition("=")
            if not sep or not name.strip():
                raise InputError(f"driver speedup {spec!r}: write DRIVER=K, e.g. conv=2")
            items.append((name.strip(), value))
    out = {}
    for name, value in items:
        try:
            k = float(value)
        except (TypeError, ValueError):
            raise InputError(f"driver speedup for {name}: {value!r} is not a number") from None
        if not k > 0:
            raise InputError(f"driver speedup for {name} must be > 0, not {k}")
        out[name] = k
    return out


def _items(proj: Projection) -> pl.DataFrame:
    """Every projected item: driver, dtype, bound, bytes share, in-situ and projected ms/step."""
    frames = []
    cols = ["driver", "dtype", "bound", "in_situ_ms", "projected_ms"]
    if not proj.primitives.is_empty():
        frames.append(proj.primitives.select(
            "driver", "dtype", "bound", pl.col("in_situ_total_ms").alias("in_situ_ms"),
            "projected_ms"))
    if not proj.ops.is_empty():
        frames.append(proj.ops.select(
            pl.format("aten:{}", pl.col("family")).alias("driver"), "dtype", "bound",
            pl.col("in_situ_total_ms").alias("in_situ_ms"), "projected_ms"))
    if not frames:
        return pl.DataFrame(schema={c: pl.Utf8 if c in ("driver", "dtype", "bound") else pl.Float64
                                    for c in cols})
    return pl.concat(frames, how="vertical_relaxed")


def _check_drivers(items: pl.DataFrame, speedups: dict[str, float]) -> None:
    known = set(items["driver"].to_list())
    for name in speedups:
        if name not in known:
            raise InputError(f"driver {name!r} is not in this projection "
                             f"(it has: {', '.join(sorted(known))})")


def _assumptions(dst: MachineProfile, dst_threads: int, to_dtype: str | None,
                 speedups: dict[str, float]) -> list[str]:
    """What the what-if assumes, in words (the target's own assumptions last)."""
    assumptions = [
        "each primitive keeps the fraction of its roofline it reaches here: compute-bound "
        "ones scale with the GEMM peak, memory-bound ones with the memory bandwidth",
        "framework overhead (step minus kernels) is single-threaded and stays as measured",
    ]
    if dst_threads > dst.cores:
        assumptions.append(f"{dst_threads} threads exceed the target's {dst.cores} physical "
                           "cores: hyperthreads add no FLOP/s, so the peaks stop at the cores")
    if to_dtype == "bf16":
        assumptions.append("BF16 for conv/deconv/ip/matmul and GEMM ops (what autocast lowers): "
                           "their bytes halve and they run at the target's BF16 peak; other "
                           "ops stay fp32, and the loss stays fp32")
    if speedups:
        assumptions.append("driver speedups: "
                           + ", ".join(f"{d} {k:g}x faster" for d, k in speedups.items())
                           + " (Amdahl: the rest of the step is unchanged)")
    return assumptions + [a for a in dst.assumptions if a not in assumptions]


def _factor(src: MachineProfile, dst: MachineProfile, src_threads: int, dst_threads: int,
            to_dtype: str | None, speedups: dict[str, float], driver: str, dt: str | None,
            bnd: str | None) -> float:
    """How much longer (>1) or shorter one primitive runs on the target: its roofline bound's
    ceiling here over there, the dtype change, and any driver speedup."""
    dt = dt or "fp32"
    new_dt = to_dtype if (to_dtype and driver in BF16_DRIVERS) else dt
    f = 1.0
    if bnd == "compute":
        f = (src.gemm_peak_gflops(dt if src.has_native(dt) else "fp32", src_threads)
             / dst.gemm_peak_gflops(new_dt if dst.has_native(new_dt) else "fp32", dst_threads))
    elif bnd == "memory":
        f = src.bandwidth_at(src_threads) / dst.bandwidth_at(dst_threads)
        if new_dt in ("bf16", "fp16") and dt == "fp32":
            f *= 0.5
    return f / speedups.get(driver, 1.0)


def whatif(proj: Projection, *, threads: int | None = None, machine: MachineProfile | None = None,
           dtype: str | None = None, driver_speedup: dict[str, float] | list[str] | None = None,
           source: MachineProfile | None = None, replayed: Projection | None = None) -> WhatIf:
    """Project ``proj``'s step to ``threads`` / ``machine`` / ``dtype`` / faster drivers.

    ``source`` is the machine the projection was measured on (default: this machine);
    ``machine`` the target (default: the source); ``threads`` the target's thread count
    (default: all its cores when ``machine`` is given, else the projection's threads).
    ``replayed``: the same Run projected here with its conv calls and GEMM ops replayed in
    ``dtype`` (``project(..., replay_dtype=dtype)``): the step model's parts are then that
    measurement, not the roofline's scaling (which assumes a compute-bound convolution runs
    at the dtype's GEMM peak: BF16 convolutions of a ResNet-50 b8 112 on an AMX Xeon ran
    1.6x faster than fp32, not the 6.5x of the GEMM peaks).
    """
    src, basis = _source(proj, source)
    dst = machine or src
    src_threads = int(proj.summary.get("threads") or src.cores)
    dst_threads = int(threads or (dst.cores if machine is not None else src_threads))
    if dst_threads < 1:
        raise InputError(f"threads must be >= 1, not {dst_threads}")
    speedups = parse_speedups(driver_speedup)
    to_dtype = normalize_dtype(dtype) if dtype else None
    if to_dtype:
        require_faster_dtype(dst, to_dtype)
    items = _items(proj)
    _check_drivers(items, speedups)
    assumptions = _assumptions(dst, dst_threads, to_dtype, speedups)
    factors = [_factor(src, dst, src_threads, dst_threads, to_dtype, speedups, d, dt, b)
               for d, dt, b in items.select("driver", "dtype", "bound").iter_rows()]
    items = items.with_columns(pl.Series("factor", factors, dtype=pl.Float64)).with_columns(
        (pl.col("in_situ_ms") * pl.col("factor")).alias("whatif_ms"),
        (pl.col("projected_ms") * pl.col("factor")).alias("whatif_projected_ms"))
    measured = proj.summary.get("measured_step_ms")
    kernels = float(items["in_situ_ms"].sum())
    framework = max(0.0, (measured or kernels) - kernels)
    step = framework + float(items["whatif_ms"].sum())
    summary = {
        "measured_step_ms": measured,
        "whatif_step_ms": step,
        "speedup": (measured / step) if measured and step else None,
        "framework_ms": framework,
        "in_situ_kernel_ms": kernels,
        "whatif_kernel_ms": float(items["whatif_ms"].sum()),
        "projected_kernel_ms": float(items["projected_ms"].sum()),
        "whatif_projected_kernel_ms": float(items["whatif_projected_ms"].sum()),
        "source_machine": src.name,
        "source_basis": basis,
        "source_threads": src_threads,
        "target_machine": dst.name,
        "target_threads": dst_threads,
        "dtype": to_dtype or "as captured",
        "driver_speedup": speedups,
    }
    summary.update(_step_fields(proj, items))
    if replayed is not None and replayed.summary.get("projected_step_ms") and not proj.step.is_empty():
        summary.update(_replayed_step_fields(proj, replayed))
        assumptions.append(f"projected_step_ms: conv calls and GEMM ops replayed in {to_dtype} here, "
                           "measured, not scaled by the roofline")
    return WhatIf(items, summary, assumptions)


def _source(proj: Projection, source: MachineProfile | None) -> tuple[MachineProfile, str]:
    """The machine ``proj`` was measured on and where its figures come from: the one given,
    else the one the projection stored in its Run, else this machine's cached profile."""
    if source is not None:
        return source, _basis(source, "the machine given")
    stored = proj.machine_profile
    if stored is not None:
        return stored, _basis(stored, "as stored in the Run by its projection")
    here = get_machine()
    return here, _basis(here, "this machine's cached profile (the Run stored none)")


def _basis(machine: MachineProfile, where: str) -> str:
    when = f", measured {str(machine.measured)[:16].replace('T', ' ')}" if machine.measured else ""
    return f"{machine.name}{when}: {where}"


def _replayed_step_fields(proj: Projection, replayed: Projection) -> dict[str, Any]:
    """``projected_step_ms`` and per-part factors from a projection replayed in the dtype."""
    from .step_model import by_part

    before = dict(by_part(proj.step).select("part", "projected_ms").iter_rows())
    after = dict(by_part(replayed.step).select("part", "projected_ms").iter_rows())
    factors = {p: (after.get(p, 0.0) / ms if ms else 1.0) for p, ms in before.items()}
    return {"projected_step_ms": replayed.summary["projected_step_ms"], "step_part_factors": factors,
            "step_measured_in": "replayed in the dtype here"}


def require_faster_dtype(machine: MachineProfile, dtype: str) -> None:
    """Raise InputError unless ``dtype`` pays on ``machine`` (a measured GEMM peak above
    fp32's, or a matrix unit for it) and has a peak to project against: no job projects a
    dtype as a speed-up elsewhere."""
    if normalize_dtype(dtype) == "fp32":
        return
    speed = machine.dtype_speed(dtype)
    if not speed.faster:
        raise InputError(f"{machine.name}: {speed.dtype} is not projected as a speed-up there ({speed.reason}); "
                         f"give --machine FILE with a {speed.dtype} GEMM peak above fp32's for a CPU where it pays")
    if speed.dtype not in machine.gemm:
        raise InputError(f"{machine.name}: {speed.dtype} pays there ({speed.reason}) but has no measured GEMM peak "
                         "to project against; `profilednn machine --refresh` measures it (or give one in "
                         "--machine FILE)")


def _step_fields(proj: Projection, items: pl.DataFrame) -> dict[str, Any]:
    """The what-if's ``projected_step_ms``: the step model's kernel parts times the what-if's
    factor of the items behind them (conv, other oneDNN, native ops), the rest as is."""
    from .step_model import CONV_CALLS, NATIVE_KERNELS, ONEDNN_OTHER, whatif_step

    if proj.step.is_empty():
        return {"projected_step_ms": None, "step_part_factors": {}}
    conv = pl.col("driver").is_in(sorted(CONV_DRIVERS))
    groups = {CONV_CALLS: conv,
              NATIVE_KERNELS: pl.col("driver").str.starts_with("aten:"),
              ONEDNN_OTHER: ~conv & ~pl.col("driver").str.starts_with("aten:")}
    factors = {}
    for part, where in groups.items():
        sel = items.filter(where)
        base = float(sel["in_situ_ms"].sum() or 0.0)
        factors[part] = float(sel["whatif_ms"].sum()) / base if base > 0 else 1.0
    return {"projected_step_ms": whatif_step(proj.step, factors), "step_part_factors": factors}


__all__ = ["WhatIf", "parse_speedups", "require_faster_dtype", "whatif"]

"""Advice rules on the process around the model: the intra-op thread count against the
physical cores, the memory allocator (calls per step, memory page-faulted in afresh every
step), and loading the batch.

Each rule documents its threshold and how it estimates the gain, from the Run's own
measurements (and its machine fingerprint) times a stated factor.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

import polars as pl

from ..recipe_catalogue import ALLOCATOR
from .rulebook import Advice, cached_machine_here, denominator, rule, severity_for, steps_mean

if TYPE_CHECKING:
    from .view import RunView


def _compute_share(a: "RunView", denom: float) -> float | None:
    """Percentage of the step spent in kernels (oneDNN + native ATen); None if unknown."""
    if a.steps is None or a.ops is None:  # a log, or a light capture: native time unknown
        return None
    cov = a.coverage()
    kernel = cov.filter(pl.col("component").is_in(["onednn", "aten"]))["ms_per_step"].sum()
    return min(float(kernel or 0.0) / denom * 100.0, 100.0)


# ------------------------------------------------------------------------- threads
OVERSUBSCRIPTION_PENALTY = 0.10  # rule of thumb: >= 10% of kernel time lost to contention


@rule("threads_vs_cores")
def threads_vs_cores(a: "RunView") -> Advice | None:
    """The intra-op thread count differs from the physical core count.

    Gain: fewer threads than cores: the kernel share times (1 - threads/cores), as if
    kernels scaled linearly; more threads than cores: 10% of kernel time (contention).
    """
    fp = a.fingerprint
    threads, cores = fp.get("threads"), fp.get("cores")
    if not threads or not cores or int(threads) == int(cores):
        return None
    threads, cores = int(threads), int(cores)
    denom, _ = denominator(a)
    known = _compute_share(a, denom) if denom else None
    kernel_pct = 100.0 if known is None else known  # unknown: assume all of it is compute
    if threads < cores:
        gain = kernel_pct * (1.0 - threads / cores)
        what = f"uses {threads} of {cores} physical cores"
    else:
        gain = kernel_pct * OVERSUBSCRIPTION_PENALTY
        what = f"runs {threads} threads on {cores} physical cores (oversubscribed)"
    env = fp.get("env") or {}
    omp = env.get("OMP_NUM_THREADS", "unset") if isinstance(env, dict) else "unset"
    sockets = fp.get("sockets") or 1
    per_rank = f" (with several ranks: {cores} / ranks each, never spanning sockets)" if sockets > 1 else ""
    return Advice(
        rule="threads_vs_cores",
        severity=severity_for(gain),
        evidence=(
            f"torch {what}; OMP_NUM_THREADS={omp}"
            + (f"; kernels are {known:.0f}% of the step" if known is not None else "")
        ),
        estimated_gain_pct=gain,
        action=(
            f"Run one compute thread per physical core: OMP_NUM_THREADS={cores} or "
            f"torch.set_num_threads({cores}){per_rank}; pin them (OMP_PROC_BIND=close, "
            "OMP_PLACES=cores) and keep data-loader workers off those cores."
        ),
    )


# ------------------------------------------------------------------------- allocator
ALLOCATIONS_PER_STEP_MIN = 1000
ALLOCATION_SAVING_US = 1.0  # lower bound saved per call by a caching allocator
# First touch of freshly mapped memory: page faults plus the kernel zeroing each page. On a
# 2-core Intel Xeon (AMX) KVM guest, filling a fresh 64 MiB buffer took 14.8 ms against
# 4.8 ms for a reused one at 2 threads (0.155 ms/MiB; 0.185 with THP_MEM_ALLOC_ENABLE).
# The default where this machine's cached profile has no figure (`profilednn machine`
# measures it: MachineProfile.page_fault_ms_per_mib).
PAGE_FAULT_MS_PER_MIB = 0.155


def _page_fault_cost(a: "RunView") -> tuple[float, str]:
    """ms per MiB of a freshly mapped buffer's first touch and where it comes from: this
    machine's cached profile (``profilednn machine``) for a Run captured on this CPU (advice
    never measures), else ``PAGE_FAULT_MS_PER_MIB``."""
    machine, captured_here = cached_machine_here(a)
    measured = machine.page_fault_ms_per_mib if machine is not None else None
    default = f"at {PAGE_FAULT_MS_PER_MIB} ms/MiB, a default measured on a 2-core Intel Xeon"
    if measured is None:
        return PAGE_FAULT_MS_PER_MIB, f"{default}; `profilednn machine` measures this CPU's"
    if not captured_here:
        return PAGE_FAULT_MS_PER_MIB, f"{default}: the Run was captured on another CPU than this machine's profile"
    return measured, f"at {measured:.3g} ms/MiB measured by `profilednn machine`"


FAULTS_STILL_FALLING = 0.7  # the last counted step below this share of the first: not settled yet


def _faulted_per_step(a: "RunView") -> tuple[float, str] | None:
    """(MiB, how it was counted) that a step page-faults in, from the capture's
    ``page_faults`` record: the median of the later half of the steps after the first that
    ``torch.profiler`` did not watch (its own buffers fault too; glibc's thresholds settle
    over the first steps, so the counts fall: pytorch/examples' ImageNet script faulted 793,
    323, 288 and 160 thousand pages in its steps 1-4, and 113 thousand a step after 6);
    None when no such step was counted."""
    record = a.manifest.get("page_faults") or {}
    per_step, profiled = record.get("per_step") or [], record.get("profiled") or []
    clean = [n for g, (n, watched) in enumerate(zip(per_step, profiled)) if g > 0 and not watched]
    if not clean:
        return None
    later = clean[len(clean) // 2:]
    faults = float(statistics.median(later))
    mib = faults * float(record.get("page_bytes") or 4096) / 2**20
    falling = len(clean) > 1 and clean[-1] < FAULTS_STILL_FALLING * clean[0]
    return mib, (f"{faults:,.0f} minor page faults a step, the median of the last {len(later)} of {len(clean)} "
                 "step(s) torch.profiler did not watch"
                 + (f", still falling ({clean[0]:,} -> {clean[-1]:,}: an estimate on the high side; "
                    "more --warmup lets the allocator settle)" if falling else ""))


@rule(ALLOCATOR)
def allocator(a: "RunView") -> Advice | None:
    """The default (glibc) allocator serves many allocations per step, or hands memory back
    to the kernel and faults it in again every step.

    Gain: 1 us saved per allocator call, plus the page faults a caching allocator (or glibc
    keeping freed memory) avoids, at the first-touch cost this machine's cached profile
    measured for a Run captured here (else ``PAGE_FAULT_MS_PER_MIB``), as a share of the
    step. Two floors of what a step faults back in, the larger counts: the faults the capture
    counted (``getrusage``, in steps the profiler did not watch: ``--light``, or warm-up
    steps after the first; they include the heap's top, trimmed and regrown), and the MiB of
    buffers above glibc's 32 MiB mmap threshold, mapped afresh every step (unmapping them
    costs too, which first-touch pricing leaves out). Runs captured before either count the
    calls only.
    """
    if str(a.fingerprint.get("allocator") or "") != "default" or not a.step_ms:
        return None
    allocs = steps_mean(a, "allocations")
    counted = _faulted_per_step(a)
    mapped = steps_mean(a, "mapped_alloc_mib") or 0.0
    if counted is not None and counted[0] < mapped:  # each is a floor of what a step faults back in
        counted = None
    mib = counted[0] if counted is not None else mapped
    ms_per_mib, cost_source = _page_fault_cost(a) if mib else (0.0, "")
    fault_ms = mib * ms_per_mib
    if allocs is None and not mib:
        return None
    if (allocs or 0.0) < ALLOCATIONS_PER_STEP_MIN and fault_ms < 0.01 * a.step_ms:
        return None
    gain = ((allocs or 0.0) * ALLOCATION_SAVING_US / 1000.0 + fault_ms) / a.step_ms * 100.0
    if counted is not None:
        faults = f"{mib:.0f} MiB a step page-faulted in afresh ({counted[1]}; ~{fault_ms:.0f} ms {cost_source})"
    elif mapped:
        faults = (f"{mapped:.0f} MiB a step in buffers above glibc's 32 MiB mmap threshold, mapped afresh and "
                  f"page-faulted in each time (~{fault_ms:.0f} ms {cost_source}); a floor: `profile --light` "
                  "counts every fault, the heap's too")
    else:
        faults = ""
    calls = (f"{allocs:.0f} allocator calls per step ({allocs / a.step_ms:.1f} per ms) through the default "
             "glibc malloc" if allocs is not None else "the default glibc malloc")
    return Advice(
        rule=ALLOCATOR,
        severity=severity_for(gain),
        evidence=calls + (f"; {faults}" if faults else ""),
        estimated_gain_pct=gain,
        action=(
            "Preload a caching allocator: LD_PRELOAD=libjemalloc.so.2 with "
            "MALLOC_CONF=oversize_threshold:1,background_thread:true,metadata_thp:auto, or "
            "LD_PRELOAD=libtcmalloc.so.4; both serve short-lived tensors from per-thread caches. With "
            "neither installed, GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1099511627776 "
            "keeps glibc from unmapping (and page-faulting back) every large activation each step. "
            "The `allocator` recipe measures which wins."
        ),
    )


# ------------------------------------------------------------------------- data loading
DATA_SHARE_MIN_PCT = 10.0
DATA_OVERLAP_SAVING = 0.5  # workers overlap loading with compute but share the cores


@rule("data_loading")
def data_loading(a: "RunView") -> Advice | None:
    """Loading the batch takes a large share of the step (seed 000, 2.4).

    Gain: half the data time: workers overlap it with compute, but on a CPU they
    compete with the compute threads for the same cores.
    """
    data = steps_mean(a, "data_ms")
    if data is None or not a.step_ms:
        return None
    share = data / a.step_ms * 100.0
    if share < DATA_SHARE_MIN_PCT:
        return None
    gain = share * DATA_OVERLAP_SAVING
    return Advice(
        rule="data_loading",
        severity=severity_for(gain),
        evidence=f"loading a batch takes {share:.1f}% of the step ({data:.2f} ms per step)",
        estimated_gain_pct=gain,
        action=(
            "Overlap loading with compute: DataLoader(num_workers=1 or 2, persistent_workers=True) "
            "and torch.set_num_threads(cores - workers); decode with Pillow-SIMD or pre-decode "
            "the dataset to tensors once."
        ),
    )


__all__ = [
    "ALLOCATIONS_PER_STEP_MIN", "ALLOCATION_SAVING_US", "DATA_OVERLAP_SAVING", "DATA_SHARE_MIN_PCT",
    "FAULTS_STILL_FALLING", "OVERSUBSCRIPTION_PENALTY", "PAGE_FAULT_MS_PER_MIB", "allocator", "data_loading",
    "threads_vs_cores",
]

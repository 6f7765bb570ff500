"""The process's resident memory over a full capture's window, and what its growth means.

``torch.profiler`` keeps its records (with ``record_shapes``, every op's shapes) until the
window closes. Under glibc's malloc those small, long-lived records land in the blocks that
the step's large activations freed and split them, so the next step's activations no longer
fit there: the heap grows and every step faults its activations in afresh. Measured on
minGPT's gpt-mini (batch 16, 2 cores, AMD EPYC Zen 3): ~0.85 GiB more heap a profiled step
with ``record_shapes``, ~0.15 GiB without, none unprofiled; after 3 profiled steps glibc's
``malloc_stats`` held 2.4 GB with 0.2 GB in use. The growth is the capture's, not the
script's: a full capture says so when it is large, with what to do about it.
"""

from __future__ import annotations

import statistics
from typing import Any

from .page_faults import page_bytes

GIB = 2**30
MIN_GROWTH_BYTES = 256 * 2**20  # below this the growth is not worth a note
MIN_GROWTH_FRACTION = 0.2  # nor below this fraction of the memory the window opened with


def resident_bytes() -> int | None:
    """This process's resident set now (``/proc/self/statm``; None where there is none)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            pages = int(fh.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * page_bytes()


def window_record(opened: int | None, closed: int | None, steps: int,
                  unprofiled: tuple[int | None, int | None, int] | None = None) -> dict[str, Any] | None:
    """``manifest["capture"]["resident"]``: the resident bytes when the profiled window opened
    and closed, over its ``steps`` steps, and (``unprofiled``: bytes at its start and end and
    its steps) over the warm-up steps observed without the profiler just before it; None when
    the profiled window's could not be read."""
    if opened is None or closed is None:
        return None
    record: dict[str, Any] = {"window_open_bytes": opened, "window_close_bytes": closed, "steps": steps}
    if unprofiled is not None and None not in unprofiled[:2] and unprofiled[2] > 0:
        record.update(unprofiled_open_bytes=unprofiled[0], unprofiled_close_bytes=unprofiled[1],
                      unprofiled_steps=unprofiled[2])
    return record


def growth_note(record: dict[str, Any] | None, faults_per_step: list[int] | None = None) -> str | None:
    """A note when the process's memory grew by more than ``MIN_GROWTH_BYTES`` and
    ``MIN_GROWTH_FRACTION`` over the profiled window (None otherwise); it blames the
    profiler only when the unprofiled steps before it grew less than half as fast (or were
    not observed: then it says so)."""
    if not record:
        return None
    opened, closed, steps = record["window_open_bytes"], record["window_close_bytes"], record["steps"]
    grown = closed - opened
    if grown < MIN_GROWTH_BYTES or grown < MIN_GROWTH_FRACTION * opened or steps < 1:
        return None
    per_step = grown / steps
    faults = ""
    if faults_per_step:
        median = statistics.median_low(faults_per_step)
        faults = f", its steps page-faulting {median:,} times each ({median * page_bytes() / GIB:.2f} GiB)"
    head = (f"the process's resident memory grew {grown / GIB:.2f} GiB over the {steps} steps torch.profiler "
            f"watched ({opened / GIB:.2f} -> {closed / GIB:.2f} GiB, {per_step / GIB:.2f} GiB a step){faults}")
    before = ""
    if "unprofiled_steps" in record:
        own = (record["unprofiled_close_bytes"] - record["unprofiled_open_bytes"]) / record["unprofiled_steps"]
        before = f"; the {record['unprofiled_steps']} warm-up steps observed before it grew {own / GIB:.2f} GiB a step"
        if own >= per_step / 2:
            return (f"{head}{before}: the script's memory grows by itself (a leak, or tensors kept across "
                    "steps), under the capture or not")
    cause = ("torch.profiler keeps its records (every op's shapes) until the window closes, and under glibc's "
             "malloc they fragment the heap, so each step's activations come from fresh memory. That growth and "
             "those faults are the capture's, not the script's, and they grow with --steps: keep a full "
             "capture's window short, or take a long one with --light")
    if not before:
        cause = (f"no steps were observed without the profiler to compare with (--warmup 4 observes some); "
                 f"if the script does not grow by itself: {cause}")
    return f"{head}{before}: {cause}"


__all__ = ["growth_note", "resident_bytes", "window_record"]

"""Minor page faults per step: the memory each training step faults in afresh.

Under glibc's default malloc a step hands memory back to the kernel -- every buffer above
the 32 MiB mmap threshold is unmapped when freed, and the top of the heap is trimmed once
it holds more than the trim threshold free -- and faults it in again (zeroed by the kernel)
the next step. ``getrusage`` counts those faults at each step's end, for the whole process.
Steps run under ``torch.profiler`` are marked: its event buffers fault in memory of their
own (about 200 MiB a BF16 ResNet-50 step on a 2-core Xeon), so the advice counts only the
steps it did not watch (``analysis.advice``).
"""

from __future__ import annotations

import os
from typing import Any, Collection

from ..verbose.markers import write_marker

try:
    import resource
except ImportError:  # not a Unix: nothing to count with
    resource = None  # type: ignore[assignment]

MANIFEST_KEY = "page_faults"


def page_bytes() -> int:
    """The size of one page a minor fault maps (4 KiB on x86-64 Linux)."""
    return os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def minor_faults() -> int | None:
    """This process's minor page faults so far; None where ``getrusage`` is missing."""
    if resource is None:
        return None
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)


def write_capture_marker(fields: str) -> None:
    """Write a capture marker stamped with this process's minor faults (one ``getrusage``),
    so every module and phase span knows the faults inside it (``attribute.py``)."""
    write_marker(fields, faults=minor_faults())


class FaultCounter:
    """The fault count at the start and at each step's end (one ``getrusage`` call each)."""

    def __init__(self) -> None:
        first = minor_faults()
        self.marks: list[int] | None = None if first is None else [first]

    def step_end(self) -> None:
        if self.marks is not None:
            self.marks.append(minor_faults() or 0)

    def per_step(self) -> list[int]:
        """The faults of each step ended so far ([] where they cannot be counted)."""
        marks = self.marks or []
        return [b - a for a, b in zip(marks, marks[1:])]

    def record(self, profiled: Collection[int], steps: int) -> dict[str, Any] | None:
        """``manifest["page_faults"]`` for the first ``steps`` steps: faults per step, and
        which ran under the profiler (``profiled``: their global step numbers)."""
        per_step = self.per_step()[:steps]
        if not per_step:
            return None
        return {"per_step": per_step,
                "profiled": [g in profiled for g in range(len(per_step))],
                "page_bytes": page_bytes()}


__all__ = ["FaultCounter", "MANIFEST_KEY", "minor_faults", "page_bytes", "write_capture_marker"]

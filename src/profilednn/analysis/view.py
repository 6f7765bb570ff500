"""What the advice rules and the comparison read of a Run: a narrow interface below them.

``RunView`` is everything an advice rule (and ``next_steps``, the rulebook's shared facts)
reads: the Run's identity, its capture tables limited to measured steps, the step count
and mean step time, and the three derived tables a rule asks for. ``RunBreakdowns`` adds
the breakdowns the comparison of two Runs reads. Both are protocols: the ``Analysis``
facade implements them (loading each table once, on first use) and imports the rule
list, while the rules and the comparison import only this module, so no module below the
facade imports it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import polars as pl


class RunView(Protocol):
    """A Run (or bare verbose log) as an advice rule reads it; a table the source lacks is
    ``None``."""

    @property
    def path(self) -> Path:
        """The Run's directory (or the log file)."""
        ...

    @property
    def is_log(self) -> bool:
        """A bare verbose log: primitives only, no manifest to act on."""
        ...

    @property
    def manifest(self) -> dict[str, Any]: ...

    @property
    def fingerprint(self) -> dict[str, Any]:
        """The machine the Run was captured on (CPU model, ISA flags, threads, cores, ...)."""
        ...

    @property
    def primitives(self) -> pl.DataFrame | None: ...

    @property
    def ops(self) -> pl.DataFrame | None: ...

    @property
    def op_events(self) -> pl.DataFrame | None: ...

    @property
    def layers(self) -> pl.DataFrame | None: ...

    @property
    def steps(self) -> pl.DataFrame | None: ...

    @property
    def n_steps(self) -> int:
        """Measured steps (1 for a log)."""
        ...

    @property
    def step_ms(self) -> float | None:
        """Mean measured step time (ms); ``None`` without a steps table."""
        ...

    def coverage(self) -> pl.DataFrame:
        """Time per step by component (oneDNN, native ATen, framework, ...)."""
        ...

    def fragments(self) -> pl.DataFrame:
        """Stretches of many short ops (fusion candidates), at the default thresholds."""
        ...

    def loss_backward(self) -> tuple[float, str]:
        """Per-step time of the loss's backward and how it was found."""
        ...


class RunBreakdowns(RunView, Protocol):
    """A ``RunView`` with the breakdowns the comparison of two Runs reads."""

    def need(self, name: str) -> pl.DataFrame:
        """A table that cannot be done without; a one-line ``RunError`` when absent."""
        ...

    def by_phase(self) -> pl.DataFrame: ...

    def by_driver(self) -> pl.DataFrame: ...

    def by_driver_direction(self) -> pl.DataFrame: ...

    def by_op(self) -> pl.DataFrame: ...

    def by_layer_phase(self) -> pl.DataFrame: ...


__all__ = ["RunBreakdowns", "RunView"]

"""Numbers, JSON and tables as the terminal and the HTML reports print them, defined once.

Each job's printer (``<job>/terminal.py``) and HTML section formats its figures with
these, so "n/a", thousands separators and percentages look the same everywhere, and
every wide table narrows (or widens, with ``--wide``) the same way.
Only rich is imported (the CLI loads it at start-up anyway).
"""

from __future__ import annotations

import json
import math
import sys
from typing import TYPE_CHECKING, Any

from rich.text import Text

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

NA = "n/a"
# A terminal at least this wide shows every column of a job's tables; a narrower one
# gets the essential columns unless the verb's --wide asks for all of them.
FULL_TABLE_WIDTH = 120
MAX_WIDE = 240  # --wide prints tables at their natural width, up to this many columns


def num(value: Any, *, missing: str = NA) -> str:
    """A table cell: floats with 3 decimals below 10 and 1 above, ints and text as they are."""
    if value is None:
        return missing
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.1f}"
    return str(value)


def fixed(value: Any, digits: int = 2, *, missing: str = "") -> str:
    """Floats with ``digits`` decimals and thousands separators; other values as text."""
    if value is None:
        return missing
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def spec(value: Any, format_spec: str, *, missing: str = "") -> str:
    """``format(value, format_spec)``, or ``missing`` for None."""
    return missing if value is None else format(value, format_spec)


def pct(value: float | None, digits: int = 1, *, missing: str = NA) -> str:
    """A fraction as a percentage: 0.123 -> ``12.3%``."""
    return missing if value is None else f"{100 * value:.{digits}f}%"


def ms(value: float | None, digits: int = 2, *, missing: str = NA, seconds: bool = False) -> str:
    """Milliseconds with the unit: ``12.34 ms``; with ``seconds``, 1000 ms and more as ``1.23 s``."""
    if value is None:
        return missing
    if seconds and value >= 1000:
        return f"{value / 1000:,.{digits}f} s"
    return f"{value:,.{digits}f} ms"


def styled(label: str, style: str, rest: object = "") -> Text:
    """``label`` in ``style``, then ``rest`` verbatim (never read as markup)."""
    return Text.assemble((label, style), str(rest))


def full_tables(console: Console, wide: bool = False) -> bool:
    """Whether tables printed on ``console`` show every column (``--wide`` or a wide terminal)."""
    return wide or console.width >= FULL_TABLE_WIDTH


def print_table(console: Console, table: Table, *, wide: bool = False) -> None:
    """Print ``table``; with ``wide`` at its natural width (at most :data:`MAX_WIDE` columns)
    even where the terminal is narrower, so no cell is cut (for ``less -S`` or a file)."""
    if not wide:
        console.print(table)
        return
    from rich.measure import Measurement

    natural = Measurement.get(console, console.options.update(width=MAX_WIDE), table).maximum
    width = console.width
    console.width = max(width, min(natural, MAX_WIDE))  # Console.print clamps to its own width
    try:
        console.print(table)
    finally:
        console.width = width


def finite(obj: Any) -> Any:
    """Non-finite floats as strings ("inf", "nan"), recursively, so the result is valid JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def print_json(obj: Any) -> None:
    """``obj`` as indented JSON on stdout (what every ``--json`` option prints)."""
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
    sys.stdout.flush()


__all__ = ["FULL_TABLE_WIDTH", "MAX_WIDE", "NA", "finite", "fixed", "full_tables", "ms", "num", "pct", "print_json",
           "print_table", "spec", "styled"]

"""Byte sizes as people write them (``8GiB``, ``512MB``, ``1.5g``) and back."""

from __future__ import annotations

import re

from ..errors import InputError

_UNITS = {
    "": 1, "b": 1,
    "k": 2**10, "kb": 10**3, "kib": 2**10,
    "m": 2**20, "mb": 10**6, "mib": 2**20,
    "g": 2**30, "gb": 10**9, "gib": 2**30,
    "t": 2**40, "tb": 10**12, "tib": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str | int, allow_zero: bool = False) -> int:
    """``"8GiB"`` -> 8589934592. Bare letters (k, m, g, t) are binary; ``GB`` is decimal."""
    if isinstance(text, int):
        if text < 0 or (text == 0 and not allow_zero):
            raise InputError(f"a memory size must be positive, not {text}")
        return text
    match = _SIZE.match(str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise InputError(f"cannot read {text!r} as a memory size; write e.g. 8GiB, 512MiB, 2GB")
    value = int(float(match.group(1)) * _UNITS[unit])
    if value < 0 or (value == 0 and not allow_zero):
        raise InputError(f"a memory size must be positive, not {text!r}")
    return value


def format_bytes(n: float | int | None) -> str:
    """A short human size: ``1.5 MiB``; ``-`` for None."""
    if n is None:
        return "-"
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.1f} {unit}"
        n /= 1024
    return f"{sign}{n:.1f} GiB"


__all__ = ["format_bytes", "parse_bytes"]

"""One row per target: what was asked, what was measured, and whether it holds here.

Statuses: ``met`` / ``missed`` (measured against its target), ``n/a`` (cannot be measured
on this machine: the reason says why, e.g. "no CUDA"), ``skipped`` (left out for time),
``error`` (the check failed or ran past the time left; the reason holds its message).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

STATUSES = ("met", "missed", "n/a", "skipped", "error")
PARTS = ("any CPU", "8+ cores", "CUDA")


@dataclass
class Row:
    """A target and its outcome on one machine."""

    part: str
    check: str
    target: str
    status: str
    figure: str = ""
    reason: str = ""
    value: float | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"row status must be one of {STATUSES}, not {self.status!r}")
        if self.part not in PARTS:
            raise ValueError(f"row part must be one of {PARTS}, not {self.part!r}")

    @classmethod
    def judged(cls, part: str, check: str, target: str, ok: bool, figure: str, value: float | None = None,
               reason: str = "", **details: Any) -> "Row":
        """A measured row: met when ``ok``."""
        return cls(part, check, target, "met" if ok else "missed", figure, reason, value, details)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Row":
        return cls(**{k: data[k] for k in ("part", "check", "target", "status")},
                   figure=data.get("figure", ""), reason=data.get("reason", ""), value=data.get("value"),
                   details=data.get("details") or {})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def counts(rows: list[Row]) -> dict[str, int]:
    return {s: sum(r.status == s for r in rows) for s in STATUSES}


def verify_json(rows: list[Row], host: dict[str, Any], meta: dict[str, Any]) -> str:
    return json.dumps({"machine": host, **meta, "counts": counts(rows), "rows": [r.to_dict() for r in rows]},
                      indent=2, default=str) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def verify_md(rows: list[Row], host: dict[str, Any], meta: dict[str, Any]) -> str:
    """The short human summary: the machine, the counts, one table line per row."""
    c = counts(rows)
    lines = [f"# verify: {host['name']}", "",
             f"{meta['started']}, {meta['elapsed_s']:.0f} s of a {meta['budget_s']:.0f} s budget; "
             + ", ".join(f"{n} {s}" for s, n in c.items() if n), ""]
    if meta.get("skipped_for_time"):
        lines += ["Skipped for time: " + ", ".join(meta["skipped_for_time"]), ""]
    lines += ["| part | check | target | figure | status | reason |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.part} | {r.check} | {_cell(r.target)} | {_cell(r.figure)} | **{r.status}** | "
                     f"{_cell(r.reason)} |")
    return "\n".join(lines) + "\n"


__all__ = ["PARTS", "STATUSES", "Row", "counts", "verify_json", "verify_md"]

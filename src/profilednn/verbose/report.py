"""What a parse saw: line counts per class, dialects, and the first problem lines."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .dialects import LINE_CLASSES, MALFORMED, PRIMITIVE

MAX_EXAMPLES = 5


@dataclass(frozen=True)
class LineIssue:
    """One line the parser could not use (or used with a caveat)."""

    line: int
    reason: str
    text: str = ""


@dataclass
class ParseReport:
    """Counts per line class (see :data:`~profilednn.verbose.dialects.LINE_CLASSES`).

    ``malformed`` keeps the first :data:`MAX_EXAMPLES` malformed lines with their line
    numbers and reasons; ``notes`` counts primitive lines kept with a caveat
    (``extra_fields``, ``undecoded_problem``, ``unreadable_mds``, ``unknown_kind``).
    ``unknown_kinds`` counts the lines per primitive kind ProfileDNN does not know:
    they are rows (kind as printed, time counted) but nothing else is decoded.
    """

    source: str = ""
    lines: int = 0
    counts: dict[str, int] = field(default_factory=lambda: {c: 0 for c in LINE_CLASSES})
    dialects: dict[str, int] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)
    malformed: list[LineIssue] = field(default_factory=list)
    notes: dict[str, int] = field(default_factory=dict)
    note_examples: list[LineIssue] = field(default_factory=list)
    unknown_kinds: dict[str, int] = field(default_factory=dict)
    replaced_utf8: bool = False
    missing_final_newline: bool = False

    @property
    def primitives(self) -> int:
        return self.counts.get(PRIMITIVE, 0)

    @property
    def n_malformed(self) -> int:
        return self.counts.get(MALFORMED, 0)

    def add(self, line_class: str, n: int) -> None:
        self.counts[line_class] = self.counts.get(line_class, 0) + n

    def add_malformed(self, issues: list[LineIssue], n: int) -> None:
        self.add(MALFORMED, n)
        self.malformed = sorted(self.malformed + list(issues), key=lambda i: i.line)[:MAX_EXAMPLES]

    def add_note(self, note: str, n: int, example: LineIssue | None) -> None:
        self.notes[note] = self.notes.get(note, 0) + n
        if example is not None and len(self.note_examples) < MAX_EXAMPLES:
            self.note_examples.append(example)

    def add_unknown_kind(self, kind: str, n: int, example: LineIssue | None) -> None:
        self.unknown_kinds[kind] = self.unknown_kinds.get(kind, 0) + n
        self.add_note("unknown_kind", n, example)

    def summary(self) -> str:
        """One line for a terminal: what was read and what was skipped."""
        parts = [f"{self.lines} lines", f"{self.primitives} primitive"]
        for cls in LINE_CLASSES:
            if cls in (PRIMITIVE, MALFORMED):
                continue
            n = self.counts.get(cls, 0)
            if n:
                parts.append(f"{n} {cls}")
        if self.dialects:
            parts.append("dialects " + "+".join(sorted(self.dialects)))
        text = ", ".join(parts)
        if self.n_malformed:
            where = ", ".join(f"line {i.line}: {i.reason}" for i in self.malformed[:3])
            text += f"; {self.n_malformed} malformed ({where})"
        for note, n in sorted(self.notes.items()):
            if note == "unknown_kind":
                kinds = ", ".join(f"{k} ({c})" for k, c in sorted(self.unknown_kinds.items()))
                text += f"; {n} of unknown primitive kind: {kinds}"
            else:
                text += f"; {n} {note.replace('_', ' ')}"
        if self.replaced_utf8:
            text += "; non-UTF-8 bytes replaced"
        if self.missing_final_newline:
            text += "; last line has no newline"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "lines": self.lines,
            "counts": dict(self.counts),
            "dialects": dict(self.dialects),
            "events": dict(self.events),
            "malformed": [vars(i) for i in self.malformed],
            "notes": dict(self.notes),
            "note_examples": [vars(i) for i in self.note_examples],
            "unknown_kinds": dict(self.unknown_kinds),
            "replaced_utf8": self.replaced_utf8,
            "missing_final_newline": self.missing_final_newline,
        }

"""What an analysis reads: a Run directory, or a bare oneDNN verbose log.

A bare log has only primitives (no framework ops, layers or steps); :class:`LogSource`
gives it the same read interface as :class:`~profilednn.run.Run` (``id``, ``path``,
``manifest``, ``fingerprint``, ``has_table``, ``table``) so every analyzer takes either.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import polars as pl

from ..errors import InputError, NoPrimitivesError, RunError
from ..run import MANIFEST, Run, is_run_dir, load_run


@dataclass
class LogSource:
    """A oneDNN verbose log read into a primitive table; it has no other table."""

    path: Path
    primitives: pl.DataFrame
    manifest: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.path.name

    @property
    def status(self) -> str:
        return "log"

    @property
    def workload(self) -> dict[str, Any]:
        return {}

    @property
    def fingerprint(self) -> dict[str, Any]:
        return dict(self.manifest.get("fingerprint") or {})

    def tables(self) -> list[str]:
        return ["primitives"]

    def has_table(self, name: str) -> bool:
        return name == "primitives"

    def table(self, name: str) -> pl.DataFrame:
        if name != "primitives":
            raise InputError(
                f"{self.path} is a bare verbose log: it has primitives only, no {name!r} "
                "(profile the workload with `profilednn profile` for framework ops, layers "
                "and steps)"
            )
        return self.primitives


Source = Union[Run, LogSource]


def read_log_source(path: Path) -> LogSource:
    """Parse a verbose log with :func:`profilednn.verbose.read_log_with_report` (the
    ``read_log`` table plus line-class counts); keep exec events."""
    from ..verbose import read_log_with_report  # lazy: the parser is its own job

    df, report = read_log_with_report(path)
    if "event" in df.columns:
        df = df.filter(pl.col("event") == "exec")
    if df.height == 0:
        raise NoPrimitivesError(f"{path} holds no executed oneDNN primitive (no `exec` line)")
    return LogSource(path=Path(path), primitives=df, manifest={"parse_report": dict(report.counts)})


def open_source(source: Source | str | Path) -> Source:
    """A Run or a log from a path; Runs and LogSources pass through unchanged.

    A directory must be a Run (it holds ``manifest.json``); a file is read as a log.
    """
    if isinstance(source, (Run, LogSource)):
        return source
    p = Path(source)
    if p.name == MANIFEST and p.is_file():
        return load_run(p.parent)
    if p.is_dir():
        if is_run_dir(p):
            return load_run(p)
        raise RunError(f"{p} is a directory but not a Run (no {MANIFEST})")
    if not p.exists():
        raise InputError(f"no such Run or verbose log: {p}")
    return read_log_source(p)

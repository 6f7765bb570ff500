"""Job Runs: Runs that a job (optimize, memory, pipeline, a distributed rank without
capture, a scale or convergence study) wrote without a profile.

Such a Run has its job's tables and no oneDNN primitives or framework ops: the profile's
sections (coverage, phases, advice) would show only zeros ("oneDNN 0.00 ms",
"unattributed 100%", "no rule fired"). Its report leads with the job's own sections and
leaves the empty profile sections out, saying so in one line. A profile Run (capture's,
or one the projection or memory job added tables to) is reported as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from ..tables import PHASE_COLUMNS, TABLES

if TYPE_CHECKING:
    from ..analysis.facade import Analysis


def has_profile(a: "Analysis") -> bool:
    """Whether the Run (or log) holds a profile: oneDNN primitives or framework ops."""
    return any(df is not None and df.height > 0 for df in (a.primitives, a.ops))


def job_tables(a: "Analysis") -> list[str]:
    """The Run's tables that a job other than capture wrote (catalogue order)."""
    if a.is_log:
        return []
    return [t.name for t in TABLES.values() if t.owner != "capture" and a.source.has_table(t.name)]


def is_job_run(a: "Analysis") -> bool:
    """A Run of job tables and no profile: its report leads with the job's sections."""
    return not a.is_log and not has_profile(a) and bool(job_tables(a))


def phases_timed(steps: pl.DataFrame | None) -> bool:
    """Whether a ``steps`` table times phases (optimize times whole steps only)."""
    if steps is None or steps.height == 0:
        return False
    cols = [c for c in PHASE_COLUMNS if c in steps.columns]
    return bool(cols) and any(float(steps[c].fill_null(0.0).abs().sum()) > 0 for c in cols)


def no_profile_line(a: "Analysis") -> str:
    """One line: why a job Run's report has no profile sections."""
    what = "/".join(dict.fromkeys(TABLES[t].owner for t in job_tables(a))) or "job"
    steps = "" if a.steps is None or phases_timed(a.steps) else "; its steps are timed whole, not by phase"
    return (f"This Run holds {what} results and no profile (no oneDNN primitives or framework ops{steps}), "
            "so the profile's sections and advice are left out; `profilednn profile` captures one.")


__all__ = ["has_profile", "is_job_run", "job_tables", "no_profile_line", "phases_timed"]

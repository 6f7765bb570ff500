"""Is this still the machine that was measured? The probe before a job uses the cached peaks.

``checked_machine`` reads the cached profile, probes the machine now at the job's thread
count (``probe.py``) and compares each figure with the probe the profile recorded:

    ratio = probe now / reference;   tolerance = the reference's noise

Within the tolerance (what the probe varied by on the machine the profile measured) the
cache is used as it is. Beyond it the figures that moved are re-measured at full size at
the job's thread count (``remeasure_at``: 1-2 s; the whole profile takes 10-15 s and, under
a neighbour's load, would replace the cache with a contended one; ``profilednn machine
--refresh`` stays the way to measure everything again) and a note says so. Each check is
appended to a bounded history beside the cache, which ``profilednn machine`` shows.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ..atomic import atomic_write_text
from .machine import MachineProfile, Measurement, cached_machine_path, get_machine, measure_bandwidth, measure_gemm
from .probe import TRIAD, Probe, ProbeFn, ProbeReference, run_probe

HISTORY_LENGTH = 20  # checks kept beside the cache (the drift over time; oldest dropped)
MEMO_S = 60.0  # a probe answers for its thread count for this long in one process (the same minute)
CACHE = "cache"  # verdicts: within noise, the cache as it is
SCALED = "scaled"  # beyond noise: peaks scaled by the probe
UNCHECKED = "unchecked"  # no reference to compare with (a hand-written file, a profile cached before probes)
STORED = "stored"  # the figures a Run stored (a job that re-reads it measures nothing now)
GIVEN = "given"  # the caller passed the machine (an injected or what-if profile): nothing to probe

_memo: dict[tuple[str, int, tuple[str, ...]], tuple[float, "MachineCheck"]] = {}


@dataclass
class MachineCheck:
    """The machine a job's figures are computed with, and how it was checked."""

    machine: MachineProfile
    verdict: str
    threads: int
    probe: Probe | None = None
    ratios: dict[str, float] = field(default_factory=dict)
    tolerance: dict[str, float] = field(default_factory=dict)
    note: str | None = None

    @property
    def drifted(self) -> bool:
        return self.verdict == SCALED

    def record(self) -> dict[str, Any]:
        """What a Run stores of the machine it ran on: the figures its numbers used and the probe."""
        m = self.machine
        out: dict[str, Any] = {
            "name": m.name, "cpu_model": m.cpu_model, "cores": m.cores, "source": m.source,
            "measured": m.measured or "", "threads": self.threads, "check": self.verdict,
            "peak_gflops": {d: m.gemm_peak_gflops(d, self.threads) for d in m.native_dtypes if m.gemm.get(d)},
            "bandwidth_gbs": m.bandwidth_at(self.threads) if m.bandwidth else None,
        }
        if self.probe is not None:
            out["probe"] = self.probe.to_dict()
            out["ratios"] = {k: round(v, 4) for k, v in self.ratios.items()}
            out["tolerance"] = {k: round(v, 4) for k, v in self.tolerance.items()}
            out["tolerance_derived"] = "the reference's noise: its rounds' range or their IQR / median"
        if self.note:
            out["note"] = self.note
        return out


def stored_machine(record: dict[str, Any] | None) -> MachineProfile | None:
    """The profile a Run stored (:meth:`MachineCheck.record`), for jobs that re-read that Run."""
    if not record or not record.get("peak_gflops"):
        return None
    t = int(record.get("threads") or 1)
    peaks = {str(d): float(p) for d, p in record["peak_gflops"].items()}
    bw = float(record.get("bandwidth_gbs") or 0.0)
    when = str(record.get("measured") or "")[:16].replace("T", " ")
    return MachineProfile(
        name=str(record.get("name") or "the Run's machine"), cpu_model=str(record.get("cpu_model") or ""),
        cores=t, native_dtypes=tuple(peaks), gemm={d: {t: Measurement.of([p])} for d, p in peaks.items()},
        bandwidth={t: Measurement.of([bw])} if bw > 0 else {}, measured=when or None, source="run")


def _short(iso: str | None) -> str:
    return (iso or "an unknown time")[:16].replace("T", " ")


# Re-measure what moved: (cached profile, threads, {figure: probe ratio}) -> the profile to use.
Remeasure = Callable[[MachineProfile, int, dict[str, float]], MachineProfile]


def remeasure_at(machine: MachineProfile, threads: int, moved: dict[str, float]) -> MachineProfile:
    """The figures that moved measured again at ``threads`` at full size (the profile's GEMM
    size, the 256 MB triad: 1-2 s); other thread counts scaled by the same change. A small
    probe GEMM overstates a contended core's cost (a descheduled thread stalls a millisecond
    call more than a 100 ms one), so the probe decides *whether*, the full size *how much*."""
    ratios = {}
    for key in moved:
        if key == TRIAD and machine.bandwidth:
            ratios[key] = measure_bandwidth(threads).best / machine.bandwidth_at(threads)
        elif key in machine.gemm:
            n = machine.gemm_size or 2048
            ratios[key] = measure_gemm(key, threads, n=n).best / machine.gemm_peak_gflops(key, threads)
    return scale_by_probe(machine, threads, ratios)


def scale_by_probe(machine: MachineProfile, threads: int, ratios: dict[str, float]) -> MachineProfile:
    """A copy of ``machine`` whose GEMM peaks (per dtype) and bandwidth are times their ratio
    (a :data:`Remeasure` that measures nothing more: for tests and what-ifs)."""
    out = copy.deepcopy(machine)

    def times(m: Measurement, r: float) -> Measurement:
        return Measurement(m.median * r, m.min * r, m.max * r, m.repeats)

    for dt, r in ratios.items():
        if dt == TRIAD:
            out.bandwidth = {t: times(m, r) for t, m in out.bandwidth.items()}
        elif dt in out.gemm:
            out.gemm[dt] = {t: times(m, r) for t, m in out.gemm[dt].items()}
    return out


AGREE = 0.10
"""A full-size re-measurement within this (or the probe's own noise, if larger) of the
profile agrees with it: the probe that moved caught a passing load, not another machine."""


def _label(key: str) -> str:
    return "triad" if key == TRIAD else f"{key} GEMM"


def _figure(profile: MachineProfile, key: str, threads: int) -> float:
    """A profile's figure for a probe key at ``threads``: the triad's bandwidth (GB/s), or the
    GEMM peak of dtype ``key`` (GFLOP/s)."""
    return profile.bandwidth_at(threads) if key == TRIAD else profile.gemm_peak_gflops(key, threads)


def _has(profile: MachineProfile, key: str) -> bool:
    return bool(profile.bandwidth) if key == TRIAD else key in profile.gemm


def full_ratios(machine: MachineProfile, used: MachineProfile, threads: int, moved: dict[str, float]
                ) -> dict[str, float]:
    """Each moved figure re-measured at full size (``used``) over the profile's: what the
    machine does now, where the probe only said *whether* it moved (``remeasure_at``)."""
    return {k: _figure(used, k, threads) / _figure(machine, k, threads) for k in moved if _has(machine, k)}


def _note(machine: MachineProfile, used: MachineProfile, threads: int, at: int, ratios: dict[str, float],
          moved: dict[str, float], tolerance: dict[str, float]) -> str:
    """What the probe (at ``at`` threads) read and, from the full-size re-measurement ``used``
    (at the job's ``threads``), how far the machine moved; or, where that agrees with the
    profile, that the probe caught a passing load (a 0.3 s probe just after a child process
    exits read 0.15x of the GEMM peak that re-measured at 1.01x)."""
    full = full_ratios(machine, used, threads, moved)
    remeasured = ", ".join(f"{_label(k)} {_figure(used, k, threads):.1f} {'GB/s' if k == TRIAD else 'GFLOP/s'}"
                           for k in moved)
    figs = ", ".join(f"{_label(k)} {r:.2f}x" for k, r in ratios.items())
    against = ", ".join(f"{_label(k)} {r:.2f}x" for k, r in full.items())
    date = _short(machine.measured)
    disagree = {k: r for k, r in full.items() if abs(r - 1.0) > max(tolerance.get(k, 0.0), AGREE)}
    if not disagree:
        return (f"a probe at {at} thread(s) read {figs} of this machine's profile of {date}, but the peaks "
                f"re-measured for this job at {at} thread(s) agree with it ({remeasured}: {against}): a "
                "passing load during the probe, not a slower or faster machine; the re-measured peaks are used")
    gemm = [r for k, r in disagree.items() if k != TRIAD] or list(disagree.values())
    worst = max(gemm, key=lambda r: abs(r - 1.0))
    how = f"{abs(1 - worst) * 100:.0f}% {'slower' if worst < 1 else 'faster'}"
    return (f"this machine ran {how} than its profile of {date} (probe at {at} thread(s): {figs}); peaks "
            f"re-measured for this job at {at} thread(s): {remeasured} ({against} of the profile); "
            "`profilednn machine --refresh` measures the whole profile again")


def check_machine(machine: MachineProfile, threads: int, dtypes: Sequence[str] | None = None, *,
                  probe: ProbeFn | None = None, remeasure: Remeasure | None = None) -> MachineCheck:
    """Probe the machine at ``threads`` and compare with ``machine``'s recorded probe (module doc)."""
    reference = ProbeReference.from_dict(machine.probe_reference)
    threads = max(1, min(int(threads), machine.cores or int(threads)))
    found = reference.at(threads) if reference else None
    if found is None:
        why = (f"the machine profile of {_short(machine.measured)} records no probe, so it was not checked for "
               "drift; `profilednn machine --refresh` measures one with it")
        return MachineCheck(machine, UNCHECKED, threads, note=why)
    at, ref = found
    wanted = [d for d in (dtypes or machine.native_dtypes) if d in ref and machine.gemm.get(d)]
    now = (probe or run_probe)(at, wanted)
    ratios, tolerance, moved = {}, {}, {}
    for key in [*wanted, TRIAD]:
        if key not in ref or key not in now.figures:
            continue
        ratios[key] = now.figures[key].value / ref[key].value
        tolerance[key] = ref[key].noise  # the probe's own spread on the unchanged machine
        if abs(ratios[key] - 1.0) > tolerance[key]:
            moved[key] = ratios[key]
    if not moved:
        return MachineCheck(machine, CACHE, threads, now, ratios, tolerance)
    used = (remeasure or remeasure_at)(machine, threads, moved)
    return MachineCheck(used, SCALED, threads, now, ratios, tolerance,
                        _note(machine, used, threads, at, ratios, moved, tolerance))


def _ratios_text(ratios: dict[str, Any], tolerance: dict[str, Any]) -> str:
    return ", ".join(f"{_label(k)} {float(r):.2f}x (noise {float(tolerance.get(k, 0)):.0%})" for k, r in ratios.items())


def describe(record: dict[str, Any] | None) -> str:
    """One line on the machine a job's figures used (a :meth:`MachineCheck.record`)."""
    if not record:
        return "machine: not stored in this Run (it predates that); figures as computed then"
    when = _short(record.get("measured") or None)
    verdict = record.get("check")
    if verdict == CACHE:
        probe = record.get("probe") or {}
        return (f"machine: {record.get('name')}, profile of {when}; a probe at {probe.get('threads')} thread(s) "
                f"agreed within its noise ({_ratios_text(record.get('ratios') or {}, record.get('tolerance') or {})})")
    if verdict == STORED:
        return f"machine: {record.get('name')} as stored in the Run (profile of {when})" + (
            f"; {record['note']}" if record.get("note") else "")
    if verdict == GIVEN:
        return f"machine: {record.get('name')} (given; not probed)"
    return f"machine: {record.get('name')}; {record.get('note') or verdict}"


def history_path(profile_path: Path | None = None) -> Path:
    """The probe history beside the cached profile (``machine-<key>.probes.json``)."""
    p = profile_path or cached_machine_path()
    return p.with_name(p.stem + ".probes.json")


def probe_history(path: Path | None = None) -> list[dict[str, Any]]:
    """The recorded checks, oldest first (empty when none or unreadable)."""
    p = path or history_path()
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [d for d in data if isinstance(d, dict)] if isinstance(data, list) else []


def remember(check: MachineCheck, path: Path | None = None) -> None:
    """Append ``check`` to the bounded history (a failure to write only warns)."""
    if check.probe is None:
        return
    p = path or history_path()
    entry = {"taken": check.probe.taken, "threads": check.probe.threads, "verdict": check.verdict,
             "cost_s": round(check.probe.cost_s, 4), "ratios": {k: round(v, 4) for k, v in check.ratios.items()},
             "tolerance": {k: round(v, 4) for k, v in check.tolerance.items()},
             "figures": {k: round(f.value, 3) for k, f in check.probe.figures.items()}}
    try:
        atomic_write_text(p, json.dumps((probe_history(p) + [entry])[-HISTORY_LENGTH:], indent=1))
    except OSError as exc:
        import warnings

        warnings.warn(f"could not record the machine probe at {p}: {exc}", stacklevel=2)


def checked_machine(threads: int, dtypes: Sequence[str] | None = None, *, probe: ProbeFn | None = None,
                    machine: MachineProfile | None = None, remeasure: Remeasure | None = None) -> MachineCheck:
    """This machine's cached profile (measured once when there is none), checked by a probe at
    ``threads``. A real probe answers for its thread count for :data:`MEMO_S` seconds in this
    process; an injected ``probe`` always runs. ``machine``: check that profile instead of the cache's."""
    prof = machine or get_machine()
    key = (str(cached_machine_path()), int(threads), tuple(dtypes or ()))
    if probe is None and machine is None and key in _memo and time.monotonic() - _memo[key][0] < MEMO_S:
        return _memo[key][1]
    check = check_machine(prof, threads, dtypes, probe=probe, remeasure=remeasure)
    remember(check)
    if probe is None and machine is None:
        _memo[key] = (time.monotonic(), check)
    return check


def given_machine(machine: MachineProfile, threads: int) -> MachineCheck:
    """The record of a machine the caller passed in (nothing probed)."""
    return MachineCheck(machine, GIVEN, max(1, int(threads)))


__all__ = ["AGREE", "CACHE", "GIVEN", "HISTORY_LENGTH", "SCALED", "STORED", "UNCHECKED", "MachineCheck",
           "check_machine", "checked_machine", "describe", "full_ratios", "given_machine", "history_path",
           "probe_history", "remeasure_at", "remember", "scale_by_probe", "stored_machine"]

"""How a job ended: which rank failed first (from the torchrun agent's report), and which
ranks ended through rank_entry's clean exit (the records they leave in the plan directory)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from . import rank_entry

# The torchrun agent stops the other ranks with these once one failed: never a root cause.
AGENT_SIGNALS = frozenset({"SIGTERM", "SIGINT", "SIGHUP"})
# A rank that exits with an error within this many seconds of a peer dying of a signal
# (gloo: "Connection reset by peer") failed because of it; since ranks end without native
# teardown (rank_entry), such an error exit can reach the agent before the peer's death.
ROOT_CAUSE_WINDOW_S = 2


def describe_failures(report: dict) -> str:
    """One line naming the failed rank that failed first (a rank that died of a signal
    before a peer's error exit in the same moment), then the others."""
    if report.get("kind") == "agent":
        return f"the torchrun agent failed: {report.get('error', 'unknown error')}"
    failures = list(report.get("failures") or [])
    if not failures:
        return "a rank failed (no details)"

    def how(f: dict) -> str:
        end = f"was killed by {f['signal']}" if f.get("signal") else f"exited with code {f['exitcode']}"
        return f"rank {f['rank']} (local rank {f['local_rank']}, pid {f['pid']}) {end}"

    first = next((f for f in failures if f.get("first")), failures[0])
    if not first.get("signal"):  # an error exit right after a peer died is its consequence
        died = [f for f in failures if f.get("signal") and f["signal"] not in AGENT_SIGNALS
                and abs(int(f.get("timestamp", 0)) - int(first.get("timestamp", 0))) <= ROOT_CAUSE_WINDOW_S]
        first = died[0] if died else first
    others = [how(f) for f in failures if f is not first]
    return how(first) + (f" (first failure; then {'; '.join(others)})" if others else "")


def rank_exits(plan_dir: Path) -> tuple[dict, ...]:
    """How this node's ranks of the job's last attempt ended through rank_entry's clean exit
    (the records they wrote under ``<plan dir>/exits/``), by rank."""
    records = []
    for path in sorted((plan_dir / rank_entry.EXITS_DIR).glob("rank*.json")):
        try:
            records.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue  # a record cut short: that rank is simply not summarised
    last = max((r.get("attempt", 0) for r in records), default=0)
    return tuple(sorted((r for r in records if r.get("attempt", 0) == last), key=lambda r: r.get("rank", -1)))


def clean_exit_note(exits: tuple[dict, ...]) -> str | None:
    """One line saying which ranks ended through the clean exit (None when none did), and the
    native threads still running in them, which a normal interpreter exit tears down."""
    if not exits:
        return None
    note = (f"clean exit: {_ranks_phrase(exits)} ended when the script did (atexit run, output flushed, "
            "no native teardown: docs/distributed.md)")
    by_threads: dict[str, list[dict]] = {}
    for record in exits:
        threads = _threads_phrase(record.get("native_threads") or [])
        if threads:
            by_threads.setdefault(threads, []).append(record)
    left = "; ".join(f"{threads} in {_ranks_phrase(records)}" for threads, records in by_threads.items())
    return note + (f"; native threads left running: {left}" if left else "")


def _ranks_phrase(records: list[dict] | tuple[dict, ...]) -> str:
    ranks = ",".join(str(r.get("rank")) for r in records)
    return f"rank{'s' if len(records) > 1 else ''} {ranks}"


def _threads_phrase(names: list[str]) -> str:
    """``gloo_tcp_loop, 2 pt_gloo_runloop``: thread names with their counts."""
    return ", ".join(name if n == 1 else f"{n} {name}" for name, n in sorted(Counter(names).items()))


__all__ = ["AGENT_SIGNALS", "ROOT_CAUSE_WINDOW_S", "clean_exit_note", "describe_failures", "rank_exits"]

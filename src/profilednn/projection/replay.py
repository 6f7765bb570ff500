"""Replay: time each unique primitive and op alone, in a child process, and match it back.

The child (:mod:`.worker`) gets its own oneDNN verbose log, the Run's thread count and
core pinning. For a oneDNN primitive the replay time is oneDNN's own verbose time of the
matching primitive in the replay's log -- the same clock the in-situ time comes from, so
framework dispatch and the reorders PyTorch wraps around the call are not counted twice.
The wall time of the whole PyTorch call is kept beside it (``replay_wall_ms``). For a
framework op (no oneDNN) the replay time is the call's wall time, the closest match to
the profiler's self time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import polars as pl

from ..errors import ProfileDNNError
from ..topology import cpu_topology
from ..verbose import read_log
from ..verbose.markers import REPLAY_EVENT, read_markers
from .cases import LOOSE_KEY, PRIM_KEY

ProgressFn = Callable[[int, int], None]


@dataclass
class ReplayResult:
    """What the worker measured: per case wall times, and the replay's own primitives.

    ``log``: the replay's exec primitives (PRIMITIVE_SCHEMA) with ``case_id`` -- the case
    whose timed calls they ran in (null outside timed calls: warm-up, creation).
    """

    cases: dict[str, dict[str, Any]]
    log: pl.DataFrame
    threads: int
    env: dict[str, Any] = field(default_factory=dict)
    log_path: Path | None = None

    def wall_ms(self, case_id: str) -> float | None:
        times = (self.cases.get(case_id) or {}).get("wall_ms")
        if not times:
            return None
        return float(pl.Series(times).median())


def _segments(log_path: Path) -> pl.DataFrame:
    """Line number -> case id of the timed region it lies in (from the marker lines)."""
    rows = [{"line": m.line, "case_id": m.args[0] if m.args[1:2] == ["timed"] else None}
            for m in read_markers(log_path, REPLAY_EVENT) if m.args]
    return pl.DataFrame(rows, schema={"line": pl.Int64, "case_id": pl.Utf8})


def _read_replay_log(log_path: Path) -> pl.DataFrame:
    text_has_prims = False
    with open(log_path, "rb") as fh:
        for raw in fh:
            if b"primitive,exec" in raw or raw.startswith((b"dnnl_verbose,exec", b"mkldnn_verbose,exec")):
                text_has_prims = True
                break
    if not text_has_prims:
        return pl.DataFrame(schema={"line": pl.Int64, "case_id": pl.Utf8})
    table = read_log(log_path).filter(pl.col("event") == "exec").sort("line")
    marks = _segments(log_path).sort("line")
    if marks.is_empty():
        return table.with_columns(pl.lit(None, pl.Utf8).alias("case_id"))
    return table.join_asof(marks, on="line", strategy="backward")


def run_worker(cases: list[dict[str, Any]], threads: int, *, progress: ProgressFn | None = None,
               budget_s: float = 0.25, min_reps: int = 5, max_reps: int = 50,
               keep_dir: Path | None = None, env: dict[str, str] | None = None,
               evict_bytes: int | None = None) -> ReplayResult:
    """Time ``cases`` in a child process pinned to ``threads`` cores; parse its log.

    ``env``: extra environment for the child (the Run's OpenMP settings); ``evict_bytes``:
    what a cold case writes before each call (``replay_cache.py``; default: sysfs's LLC).
    """
    if threads < 1:
        raise ProfileDNNError(f"threads must be >= 1, not {threads}")
    topo = cpu_topology()
    cpus = topo.first_cpus()
    if threads > len(cpus):
        cpus = sorted(c for core in topo.cores for c in core.cpus)
    own_dir = keep_dir is None  # a temporary folder: removed whatever happens
    workdir = Path(keep_dir) if keep_dir else Path(tempfile.mkdtemp(prefix="profilednn-replay-"))
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        cases_path, results_path = workdir / "cases.json", workdir / "results.json"
        log_path = workdir / "replay_verbose.log"
        cases_path.write_text(json.dumps({"cases": cases, "cpus": cpus, "budget_s": budget_s,
                                          "min_reps": min_reps, "max_reps": max_reps,
                                          "evict_bytes": evict_bytes}))
        extra = dict(env or {})
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("ONEDNN_VERBOSE", "DNNL_VERBOSE", "MKLDNN_VERBOSE"))}
        env.update(extra)
        env.update({"ONEDNN_VERBOSE": "profile_exec", "OMP_NUM_THREADS": str(threads),
                    "MKL_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"})
        other: list[str] = []
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "profilednn.projection.worker", str(cases_path),
                 str(results_path), str(threads)],
                stdout=log, stderr=subprocess.PIPE, env=env, text=True)
            assert proc.stderr is not None
            try:
                for line in proc.stderr:
                    if line.startswith("progress "):
                        done, total = (int(v) for v in line.split()[1:3])
                        if progress is not None:
                            progress(done, total)
                    else:
                        other.append(line.rstrip())
            except BaseException:
                proc.kill()
                proc.wait()
                raise
            code = proc.wait()
        if code != 0 or not results_path.exists():
            tail = " | ".join(line for line in other[-5:] if line.strip())
            raise ProfileDNNError(f"the replay worker failed (exit {code}): {tail or 'no output'}")
        data = json.loads(results_path.read_text())
        kept = {r["segment"]: r["id"] for r in data["results"] if r.get("segment")}
        log_table = _read_replay_log(log_path)
        if "case_id" in log_table.columns:  # keep the kept attempt of each case, named by its case
            log_table = log_table.with_columns(
                pl.col("case_id").replace_strict(kept, default=None, return_dtype=pl.Utf8))
        return ReplayResult(cases={r["id"]: r for r in data["results"]}, log=log_table,
                            threads=threads, env=data.get("env") or {}, log_path=None if own_dir else log_path)
    finally:
        if own_dir:
            shutil.rmtree(workdir, ignore_errors=True)


# --------------------------------------------------------------------------- matching
def _key_expr(cols: tuple[str, ...], df: pl.DataFrame) -> pl.Expr:
    return pl.concat_str([pl.col(c).cast(pl.Utf8).fill_null("") if c in df.columns else pl.lit("")
                          for c in cols], separator="|")


def _stats(log: pl.DataFrame, key: tuple[str, ...]) -> dict[tuple[str | None, str], dict]:
    """(case_id, key) -> median time, impl, count of the replay's timed executions."""
    if log.is_empty() or "driver" not in log.columns or "case_id" not in log.columns:
        return {}
    timed = log.filter(pl.col("case_id").is_not_null()).with_columns(_key_expr(key, log).alias("_k"))
    agg = timed.group_by("case_id", "_k").agg(
        pl.col("time_ms").median().alias("ms"), pl.col("impl").mode().first().alias("impl"),
        pl.len().alias("n"))
    return {(r["case_id"], r["_k"]): r for r in agg.iter_rows(named=True)}


def match_primitives(unique: pl.DataFrame, replay: ReplayResult) -> pl.DataFrame:
    """Attach ``replay_ms``, ``replay_impl``, ``same_impl``, ``match`` and a ``note``.

    Exact match: same driver, prop kind, direction, dtypes, formats, algorithm, post-ops
    and problem, in the primitive's own timed replay (else in any replay: reorders run
    inside convolutions). Loose match: same driver, direction, dtypes and problem but
    other memory formats (said in the note).
    """
    exact = _stats(replay.log, PRIM_KEY)
    loose = _stats(replay.log, LOOSE_KEY)
    by_key_any: dict[str, list[dict]] = {}
    for (cid, k), r in exact.items():
        by_key_any.setdefault(k, []).append(r)
    loose_any: dict[str, list[dict]] = {}
    for (cid, k), r in loose.items():
        loose_any.setdefault(k, []).append(r)
    ekeys = unique.select(_key_expr(PRIM_KEY, unique).alias("k"))["k"].to_list()
    lkeys = unique.select(_key_expr(LOOSE_KEY, unique).alias("k"))["k"].to_list()
    out = []
    for row, ek, lk in zip(unique.iter_rows(named=True), ekeys, lkeys):
        cid = row.get("case_id")
        res = replay.cases.get(cid) if cid else None
        hit, match, note = None, None, row.get("note")
        if res and res.get("error"):
            note = f"replay failed: {res['error']}"
        if (cid, ek) in exact:
            hit, match, note = exact[(cid, ek)], "exact", None
        elif ek in by_key_any:
            hit = max(by_key_any[ek], key=lambda r: r["n"])
            match, note = "exact (inside another replay)", None
        elif row.get("driver") != "reorder" and ((cid, lk) in loose or lk in loose_any):
            hit = loose.get((cid, lk)) or max(loose_any[lk], key=lambda r: r["n"])
            match = "loose"
            note = "replayed with other memory formats than in situ"
        elif res and not res.get("error"):
            seen = replay.log.filter(pl.col("case_id") == cid) if "case_id" in replay.log.columns \
                else pl.DataFrame()
            ran = ", ".join(sorted({f"{d} {x or ''} {i}".replace("  ", " ") for d, x, i in
                                    seen.select("driver", "direction", "impl").iter_rows()})) \
                if not seen.is_empty() else "no oneDNN primitive"
            note = f"not reproduced: the replay ran {ran}"
        same = None if hit is None else (hit["impl"] == row.get("impl"))
        if hit is not None and not same:
            extra = f"oneDNN picked {hit['impl']} in the replay, {row.get('impl')} in situ"
            note = f"{note}; {extra}" if note else extra
        out.append({
            "replay_ms": None if hit is None else float(hit["ms"]),
            "replay_impl": None if hit is None else hit["impl"],
            "replay_execs": None if hit is None else int(hit["n"]),
            "same_impl": same,
            "match": match or "none",
            "replay_wall_ms": replay.wall_ms(cid) if cid else None,
            "replay_call": (res or {}).get("call"),
            "note": note,
        })
    schema = {"replay_ms": pl.Float64, "replay_impl": pl.Utf8, "replay_execs": pl.Int64,
              "same_impl": pl.Boolean, "match": pl.Utf8, "replay_wall_ms": pl.Float64,
              "replay_call": pl.Utf8, "note": pl.Utf8}
    extra = pl.DataFrame(out, schema=schema)
    return pl.concat([unique.drop([c for c in schema if c in unique.columns]), extra],
                     how="horizontal")


__all__ = ["ReplayResult", "match_primitives", "run_worker"]

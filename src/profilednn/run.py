"""The Run: one directory per profiled workload, shared by every job.

Layout (see design.md): ``manifest.json`` plus Parquet tables (``primitives``, ``ops``,
``layers``, ``steps``, and whatever later jobs add) and the raw ``verbose.log``.
Every write goes to a temporary name in the same directory and is renamed into place,
so a crash never leaves a half-written file behind.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import secrets
import shutil
import socket
import tempfile
import threading
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import polars as pl

from .atomic import (  # noqa: F401  (re-exported: run.atomic_* is public)
    atomic_target,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_parquet,
    atomic_write_text,
)
from .errors import RunError
from .interrupts import hold_interrupts, interrupt_exit_code, system_exit_code
from .tables import LAYERS, OPS, PRIMITIVES, STEPS, Table

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
STATUSES = ("running", "complete", "failed", "interrupted")
DEFAULT_RUNS_DIR = Path("runs")
HEARTBEAT_S = 15.0  # a running Run's manifest is re-stamped this often
STALE_AFTER_S = 8 * HEARTBEAT_S  # another host's Run with an older heartbeat is dead
_MANIFEST_LOCK = threading.RLock()  # the heartbeat thread and the owner both save it


# --------------------------------------------------------------------------- the Run
def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def new_run_id(label: str = "run") -> str:
    """A sortable, unique id: UTC time, a label, and a short random suffix."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in label)[:40] or "run"
    return f"{stamp}-{safe}-{secrets.token_hex(2)}"


@dataclass
class Run:
    """A Run directory: its manifest and lazily loaded tables."""

    path: Path
    manifest: dict[str, Any] = field(default_factory=dict)
    _beat: Any = field(default=None, init=False, repr=False, compare=False)

    # -- identity ------------------------------------------------------------------------
    @property
    def id(self) -> str:
        return str(self.manifest.get("id", self.path.name))

    @property
    def recorded_status(self) -> str:
        """The status as written in the manifest."""
        return str(self.manifest.get("status", "unknown"))

    @property
    def status(self) -> str:
        """The recorded status, except ``dead`` for a ``running`` Run whose process is gone."""
        recorded = self.recorded_status
        if recorded == "running" and process_gone(self.manifest):
            return "dead"
        return recorded

    @property
    def workload(self) -> dict[str, Any]:
        return dict(self.manifest.get("workload") or {})

    @property
    def fingerprint(self) -> dict[str, Any]:
        return dict(self.manifest.get("fingerprint") or {})

    # -- tables --------------------------------------------------------------------------
    def table_path(self, name: str | Table) -> Path:
        return self.path / f"{name}.parquet"

    def promised_tables(self) -> list[str]:
        """The tables the manifest says this Run holds."""
        names = self.manifest.get("tables") or []
        return sorted(str(n) for n in names) if isinstance(names, list) else []

    def missing_tables(self) -> list[str]:
        """Tables the manifest promises whose file is gone."""
        return [n for n in self.promised_tables() if not self.table_path(n).exists()]

    def has_table(self, name: str | Table) -> bool:
        """True when the file exists or the manifest promises it (then reading it fails
        loudly if the file is gone, instead of a job silently doing without it)."""
        return self.table_path(name).exists() or str(name) in self.promised_tables()

    def table(self, name: str | Table) -> pl.DataFrame:
        """Load one table; a one-line error naming the file if it is missing or unreadable."""
        name = str(name)
        p = self.table_path(name)
        if not p.exists():
            if name in self.promised_tables():
                raise RunError(f"{p} is missing: the manifest of this Run lists table {name!r}")
            have = ", ".join(sorted(self.tables())) or "none"
            raise RunError(f"Run {self.path} has no table {name!r} (it has: {have})")
        try:
            return pl.read_parquet(p)
        except Exception as exc:  # pyarrow/polars raise many kinds
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise RunError(f"cannot read table {p}: {first}") from exc

    def tables(self) -> list[str]:
        """Tables on disk and tables the manifest promises."""
        return sorted({p.stem for p in self.path.glob("*.parquet")} | set(self.promised_tables()))

    @property
    def primitives(self) -> pl.DataFrame:
        return self.table(PRIMITIVES)

    @property
    def ops(self) -> pl.DataFrame:
        return self.table(OPS)

    @property
    def layers(self) -> pl.DataFrame:
        return self.table(LAYERS)

    @property
    def steps(self) -> pl.DataFrame:
        return self.table(STEPS)

    @property
    def verbose_log(self) -> Path:
        return self.path / "verbose.log"

    # -- writing -------------------------------------------------------------------------
    def write_table(self, name: str | Table, df: pl.DataFrame) -> Path:
        """Add or replace a table and record it in the manifest. A catalogued ``Table``
        (``profilednn.tables``) must have the columns its readers rely on."""
        if isinstance(name, Table) and (missing := name.missing_columns(df)):
            raise RunError(f"table {name.name!r} lacks column(s) {', '.join(missing)} that its readers need")
        p = self.table_path(name)
        atomic_write_parquet(p, df)
        names = set(self.manifest.get("tables") or [])
        names.add(str(name))
        self.manifest["tables"] = sorted(names)
        self.save_manifest()
        return p

    def update(self, **fields: Any) -> None:
        """Merge fields into the manifest and save it."""
        self.manifest.update(fields)
        self.save_manifest()

    def set_status(self, status: str, **fields: Any) -> None:
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, not {status!r}")
        if status != "running":
            self.stop_heartbeat()
        with _MANIFEST_LOCK:
            self.manifest["status"] = status
            if status != "running":
                self.manifest["finished"] = _now()
            self.update(**fields)

    def save_manifest(self) -> None:
        with _MANIFEST_LOCK:
            atomic_write_json(self.path / MANIFEST, self.manifest)

    # -- liveness ------------------------------------------------------------------------
    def start_heartbeat(self, interval_s: float = HEARTBEAT_S) -> None:
        """Re-stamp ``heartbeat`` in the manifest every ``interval_s`` while running, so a
        reader on another host can tell a live Run from one whose process died."""
        if self._beat is not None:
            return
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(interval_s):
                try:
                    with _MANIFEST_LOCK:
                        if stop.is_set():
                            return
                        self.manifest["heartbeat"] = _now()
                        self.save_manifest()
                except OSError:
                    return  # the directory went away; nothing left to keep alive

        thread = threading.Thread(target=beat, name=f"profilednn-heartbeat-{self.path.name}", daemon=True)
        self._beat = (stop, thread)
        thread.start()

    # -- lifecycle -----------------------------------------------------------------------
    def __enter__(self) -> "Run":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        """End a ``with create_run(...) as run:`` block: a Run still ``running`` becomes
        ``complete``, ``failed`` (with the traceback) or ``interrupted`` (Ctrl-C, and
        SIGTERM/SIGHUP under the CLI); the exception, if any, propagates with the Run
        hung on it as ``exc.run``. A status the job set itself is kept."""
        finish_run(self, exc)

    def __getstate__(self) -> dict[str, Any]:
        """Pickles without the heartbeat thread (it belongs to the writing process)."""
        return {**self.__dict__, "_beat": None}

    def stop_heartbeat(self) -> None:
        beat = self._beat
        if beat is not None:
            beat[0].set()
            self._beat = None

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, status={self.status!r})"


def check_writable(runs_dir: Path, need_bytes: int = 50 * 2**20) -> Path:
    """Fail early, before any workload starts, when ``runs_dir`` cannot take a Run."""
    runs_dir = Path(runs_dir)
    try:
        runs_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunError(f"cannot create runs directory {runs_dir}: {exc.strerror or exc}") from exc
    if not os.access(runs_dir, os.W_OK | os.X_OK):
        raise RunError(f"runs directory {runs_dir} is not writable")
    try:
        probe = tempfile.NamedTemporaryFile(dir=runs_dir, prefix=".probe.", delete=True)
        probe.write(b"x")
        probe.flush()
        probe.close()
    except OSError as exc:
        raise RunError(f"cannot write into {runs_dir}: {exc.strerror or exc}") from exc
    free = shutil.disk_usage(runs_dir).free
    if free < need_bytes:
        raise RunError(
            f"only {free / 2**20:.1f} MiB free in {runs_dir}; a Run needs at least "
            f"{need_bytes / 2**20:.0f} MiB"
        )
    return runs_dir


def create_run(
    runs_dir: Path | str = DEFAULT_RUNS_DIR,
    *,
    label: str = "run",
    command: list[str] | str | None = None,
    workload: dict[str, Any] | None = None,
    fingerprint: dict[str, Any] | None = None,
    **extra: Any,
) -> Run:
    """Create a new Run directory with status ``running``.

    Use it as ``with create_run(...) as run:`` so the Run always gets its final status
    (``complete``, ``failed`` with the traceback, or ``interrupted``)."""
    runs_dir = check_writable(Path(runs_dir))
    run_id = new_run_id(label)
    path = runs_dir / run_id
    path.mkdir(parents=True, exist_ok=False)
    manifest: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "id": run_id,
        "created": _now(),
        "status": "running",
        "process": process_identity(),
        "heartbeat": _now(),
        "command": command,
        "workload": workload or {},
        "fingerprint": fingerprint or {},
        "steps": 0,
        "tables": [],
    }
    manifest.update(extra)
    run = Run(path=path, manifest=manifest)
    run.save_manifest()
    run.start_heartbeat()
    return run


def final_status(exc: BaseException | None) -> tuple[str, dict[str, Any]]:
    """The status a job's Run ends with when the job ended by ``exc`` (``None``: normally),
    and the manifest fields that say why (error, traceback, exit code)."""
    if exc is None:
        return "complete", {}
    code = system_exit_code(exc) if isinstance(exc, SystemExit) else None
    if code == 0:  # sys.exit(0): a normal end
        return "complete", {"exit_code": 0}
    fields: dict[str, Any] = {"error": f"{type(exc).__name__}: {exc}",
                              "traceback": "".join(traceback.format_exception(exc))}
    if code is not None:  # sys.exit(3), sys.exit("message")
        return "failed", {**fields, "exit_code": code}
    if isinstance(exc, KeyboardInterrupt):  # Ctrl-C, or interrupts.Terminated (SIGTERM/SIGHUP)
        return "interrupted", {**fields, "exit_code": interrupt_exit_code(exc)}
    return "failed", {**fields, "exit_code": 1}


def finish_run(run: Run, exc: BaseException | None, **fields: Any) -> None:
    """Record the final status of ``run`` for a job that ended by ``exc`` (see
    :func:`final_status`), unless the job already set one; ``fields`` go into the manifest
    on a normal end. A second termination signal cannot cut the save short."""
    if run.recorded_status == "running":
        status, why = final_status(exc)
        with hold_interrupts():
            run.set_status(status, **(why if exc is not None else fields))
    if exc is not None:
        with contextlib.suppress(AttributeError, TypeError):
            exc.run = run  # type: ignore[attr-defined]


def process_identity() -> dict[str, Any]:
    """This process as a Run records it: pid, host and start time (pids get reused)."""
    ident: dict[str, Any] = {"pid": os.getpid(), "host": socket.gethostname()}
    try:
        import psutil

        ident["started"] = round(psutil.Process().create_time(), 2)
    except Exception:  # psutil cannot see this process: pid and host still identify it
        pass
    return ident


def process_gone(manifest: dict[str, Any], now: float | None = None) -> bool:
    """True when the process that writes a ``running`` Run no longer exists.

    On this host the pid (and its start time) decide; elsewhere a heartbeat older than
    :data:`STALE_AFTER_S` does. A Run without process information is never called dead.
    """
    proc = manifest.get("process")
    if not isinstance(proc, dict) or not isinstance(proc.get("pid"), int):
        return False
    if proc.get("host") == socket.gethostname():
        import psutil

        try:
            started = psutil.Process(proc["pid"]).create_time()
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return True
        except psutil.Error:
            return False  # exists, but we may not look at it
        recorded = proc.get("started")
        return isinstance(recorded, (int, float)) and abs(started - recorded) > 1.0
    beat = manifest.get("heartbeat")
    try:
        last = _dt.datetime.fromisoformat(str(beat)).timestamp()
    except ValueError:
        return False
    now = _dt.datetime.now(_dt.timezone.utc).timestamp() if now is None else now
    return now - last > STALE_AFTER_S


def load_run(path: Path | str) -> Run:
    """Open an existing Run directory (or the manifest.json inside one)."""
    p = Path(path)
    if p.name == MANIFEST:
        p = p.parent
    mf = p / MANIFEST
    if not p.exists():
        raise RunError(f"no such Run: {p}")
    if not mf.exists():
        raise RunError(f"{p} is not a Run (no {MANIFEST})")
    try:
        manifest = json.loads(mf.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RunError(f"cannot read {mf}: {exc}") from exc
    if not isinstance(manifest, dict):
        raise RunError(f"{mf} is not a JSON object")
    version = manifest.get("schema_version")
    if version is not None and (not isinstance(version, int) or isinstance(version, bool)):
        raise RunError(f"{mf}: schema_version must be an integer, not {version!r}")
    if version is not None and version > SCHEMA_VERSION:
        raise RunError(
            f"{p} was written by a newer ProfileDNN (schema {version} > {SCHEMA_VERSION}); "
            "upgrade to read it"
        )
    return Run(path=p, manifest=manifest)


def is_run_dir(path: Path | str) -> bool:
    return (Path(path) / MANIFEST).is_file()


def iter_runs(runs_dir: Path | str = DEFAULT_RUNS_DIR) -> Iterator[Run]:
    """Every Run under ``runs_dir``, oldest first.

    A Run whose manifest cannot be read is still listed, with status ``unreadable`` and
    the reason under ``error``, so nothing disappears from a listing silently.
    """
    root = Path(runs_dir)
    if not root.exists():
        raise RunError(f"no such runs directory: {root}")
    if not root.is_dir():
        raise NotARunsDirError(f"{root} is a file, not a directory of Runs")
    for p in sorted(root.iterdir()):
        if is_run_dir(p):
            try:
                yield load_run(p)
            except (RunError, OSError, ValueError, TypeError) as exc:
                yield Run(path=p, manifest={"id": p.name, "status": "unreadable", "error": str(exc)})


class NotARunsDirError(RunError):
    """``runs`` was given a file where a directory of Runs belongs (a usage error)."""

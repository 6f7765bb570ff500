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
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import polars as pl

from .errors import RunError

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
STATUSES = ("running", "complete", "failed", "interrupted")
DEFAULT_RUNS_DIR = Path("runs")


# --------------------------------------------------------------------------- atomic writes
def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_target(path: Path) -> Iterator[str]:
    """Yield a temporary name beside ``path``; on success it replaces ``path``.

    The temporary file gets ordinary permissions (``mkstemp`` makes it 0600); on any
    error it is removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename."""
    with atomic_target(path) as tmp, open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def atomic_write_parquet(path: Path, df: pl.DataFrame) -> None:
    """Write a polars DataFrame as Parquet, atomically."""
    with atomic_target(path) as tmp:
        df.write_parquet(tmp)


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

    # -- identity ------------------------------------------------------------------------
    @property
    def id(self) -> str:
        return str(self.manifest.get("id", self.path.name))

    @property
    def status(self) -> str:
        return str(self.manifest.get("status", "unknown"))

    @property
    def workload(self) -> dict[str, Any]:
        return dict(self.manifest.get("workload") or {})

    @property
    def fingerprint(self) -> dict[str, Any]:
        return dict(self.manifest.get("fingerprint") or {})

    # -- tables --------------------------------------------------------------------------
    def table_path(self, name: str) -> Path:
        return self.path / f"{name}.parquet"

    def has_table(self, name: str) -> bool:
        return self.table_path(name).exists()

    def table(self, name: str) -> pl.DataFrame:
        """Load one table; a clear error if this Run does not have it."""
        p = self.table_path(name)
        if not p.exists():
            have = ", ".join(sorted(self.tables())) or "none"
            raise RunError(f"Run {self.path} has no table {name!r} (it has: {have})")
        try:
            return pl.read_parquet(p)
        except Exception as exc:  # pyarrow/polars raise many kinds
            raise RunError(f"cannot read {p}: {exc}") from exc

    def tables(self) -> list[str]:
        return sorted(p.stem for p in self.path.glob("*.parquet"))

    @property
    def primitives(self) -> pl.DataFrame:
        return self.table("primitives")

    @property
    def ops(self) -> pl.DataFrame:
        return self.table("ops")

    @property
    def layers(self) -> pl.DataFrame:
        return self.table("layers")

    @property
    def steps(self) -> pl.DataFrame:
        return self.table("steps")

    @property
    def verbose_log(self) -> Path:
        return self.path / "verbose.log"

    # -- writing -------------------------------------------------------------------------
    def write_table(self, name: str, df: pl.DataFrame) -> Path:
        """Add or replace a table and record it in the manifest."""
        p = self.table_path(name)
        atomic_write_parquet(p, df)
        names = set(self.manifest.get("tables") or [])
        names.add(name)
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
        self.manifest["status"] = status
        if status != "running":
            self.manifest["finished"] = _now()
        self.update(**fields)

    def save_manifest(self) -> None:
        atomic_write_json(self.path / MANIFEST, self.manifest)

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
    """Create a new Run directory with status ``running``."""
    runs_dir = check_writable(Path(runs_dir))
    run_id = new_run_id(label)
    path = runs_dir / run_id
    path.mkdir(parents=True, exist_ok=False)
    manifest: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "id": run_id,
        "created": _now(),
        "status": "running",
        "command": command,
        "workload": workload or {},
        "fingerprint": fingerprint or {},
        "steps": 0,
        "tables": [],
    }
    manifest.update(extra)
    run = Run(path=path, manifest=manifest)
    run.save_manifest()
    return run


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
    if version is not None and int(version) > SCHEMA_VERSION:
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
    for p in sorted(root.iterdir()):
        if is_run_dir(p):
            try:
                yield load_run(p)
            except RunError as exc:
                yield Run(path=p, manifest={"id": p.name, "status": "unreadable", "error": str(exc)})

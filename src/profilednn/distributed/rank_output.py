"""Per-rank output: each rank writes its own log files; the launcher relays whole, tagged lines.

Ranks that share one pipe tear each other's lines (``...in_sync Truerank 0/2 ...``):
a ``print`` is several ``write`` calls. So ``rank_entry`` points each rank's stdout and
stderr at files in the job directory (``<job>/logs/rank<R>.stdout.log`` and
``.stderr.log``; a restarted attempt N writes ``rank<R>.attempt<N>.*.log``), and the
launcher follows those files, cutting at newlines only: every line reaches the console
whole, prefixed ``[rank<R>]: ``, stdout lines on stdout and stderr lines on stderr,
for the ranks asked for (``--ranks 0,1``; all by default). Files never block a rank the
way a full pipe would, and they stay as the job's per-rank logs.
"""

from __future__ import annotations

import contextlib
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from ..errors import InputError

LOG_NAME = re.compile(r"^rank(?P<rank>\d+)(?:\.attempt(?P<attempt>\d+))?\.(?P<stream>stdout|stderr)\.log$")
POLL_S = 0.1


def log_file_name(rank: int, stream: str, attempt: int = 0) -> str:
    """``rank<R>.stdout.log`` (attempt 0) or ``rank<R>.attempt<N>.stdout.log``."""
    middle = f".attempt{attempt}" if attempt else ""
    return f"rank{rank}{middle}.{stream}.log"


def parse_ranks(text: str | None) -> frozenset[int] | None:
    """``"0"`` or ``"0,2"`` -> those ranks; None, ``""`` or ``"all"`` -> every rank."""
    if text is None or text.strip().lower() in ("", "all"):
        return None
    try:
        ranks = frozenset(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise InputError(f"--ranks takes comma-separated rank numbers (e.g. 0 or 0,1) or 'all', not {text!r}") from None
    if not ranks or min(ranks) < 0:
        raise InputError(f"--ranks takes rank numbers >= 0, not {text!r}")
    return ranks


@dataclass
class _Followed:
    rank: int
    sink: TextIO
    offset: int = 0
    partial: bytes = b""


@dataclass
class RankOutput:
    """Follow ``log_dir``'s rank logs and write their complete lines to ``stdout``/``stderr``.

    Use as a context manager around the job: leaving it reads what is left and ends an
    unterminated last line with a newline.
    """

    log_dir: Path
    stdout: TextIO
    stderr: TextIO
    ranks: frozenset[int] | None = None
    prefix: bool = True
    poll_s: float = POLL_S
    _files: dict[Path, _Followed] = field(default_factory=dict, init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)

    def __enter__(self) -> "RankOutput":
        self._discover()  # a reused job directory: relay only what this job writes
        for path, f in self._files.items():
            with contextlib.suppress(OSError):
                f.offset = path.stat().st_size
        self._thread = threading.Thread(target=self._loop, name="profilednn-rank-output", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop following, relay the rest, finish partial lines."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.poll(final=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.poll()

    def _discover(self) -> None:
        if not self.log_dir.is_dir():
            return
        for path in sorted(self.log_dir.iterdir()):
            if path in self._files:
                continue
            m = LOG_NAME.match(path.name)
            if m is None:
                continue
            sink = self.stdout if m["stream"] == "stdout" else self.stderr
            self._files[path] = _Followed(rank=int(m["rank"]), sink=sink)

    def poll(self, final: bool = False) -> None:
        """Relay what the files gained since the last poll (complete lines only unless ``final``)."""
        self._discover()
        for path, f in self._files.items():
            try:
                with open(path, "rb") as fh:
                    fh.seek(f.offset)
                    data = fh.read()
            except FileNotFoundError:
                continue
            f.offset += len(data)
            data = f.partial + data
            lines = data.split(b"\n")
            f.partial = lines.pop()
            if final and f.partial:
                lines.append(f.partial)
                f.partial = b""
            if lines and (self.ranks is None or f.rank in self.ranks):
                self._write(f, lines)

    def _write(self, f: _Followed, lines: list[bytes]) -> None:
        tag = f"[rank{f.rank}]: " if self.prefix else ""
        own = tag.rstrip()  # torch tags a rank's uncaught traceback itself: not twice
        decoded = (line.decode("utf-8", errors="replace") for line in lines)
        f.sink.write("".join(f"{'' if own and t.startswith(own) else tag}{t}\n" for t in decoded))
        f.sink.flush()


__all__ = ["LOG_NAME", "RankOutput", "log_file_name", "parse_ranks"]

"""benchdnn batch files: seed 000's "template parameter file", written and read back.

One line per distinct problem, most expensive first, each a complete benchdnn argument
list starting with its driver switch, with the calls and time seen in the log as a
trailing comment (benchdnn skips from ``#`` to the end of a line)::

    --conv --reset --dir=FWD_B --dt=f32 --stag=abcd --wtag=Acdb8a --dtag=aBcd8b --alg=direct mb2_ic3oc8_ih16oh16kh3sh1dh0ph1_iw16ow16kw3sw1dw0pw1 # calls=12 time_ms=2.786 avg_ms=0.2322 impl=jit:avx2

Run a line with ``./benchdnn --mode=P <line>``; the file's header shows a loop that runs
them all. :func:`parse_batch` reads the format back (the round trip the tests check).
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Union

import polars as pl

from .attrs import benchdnn_alg, parse_attrs, parse_aux
from .dialects import PRIM_KIND_TO_DRIVER
from .mds import MemoryDesc, parse_mds, roles
from .problem import ProblemError, decode_problem, encode_problem
from .reader import SHAPE_COLUMNS, VerboseLog, filter_event
from ..atomic import atomic_write_text
from ..vocabulary import COMPUTE_DRIVERS

_CANONICAL = frozenset({"conv", "deconv", "pool", "ip"})
_WITH_DIR = frozenset({
    "conv", "deconv", "ip", "pool", "eltwise", "bnorm", "lnorm", "gnorm", "softmax", "lrn",
    "shuffle", "resampling", "prelu",
})
_WITH_ALG = frozenset({
    "conv", "deconv", "pool", "eltwise", "binary", "softmax", "lrn", "resampling", "reduction", "rnn",
})

HEADER = """\
# benchdnn problems from a oneDNN verbose log (written by ProfileDNN), most expensive first.
# Each line is one benchdnn invocation; the comment gives what the log saw. Run them all:
#   grep -v '^#' FILE | sed 's/ #.*//' | while read -r args; do ./benchdnn --mode=P $args; done
"""


@dataclass(frozen=True)
class BatchLine:
    """One benchdnn problem: driver, knobs in order, descriptor, and the log's totals."""

    driver: str
    options: tuple[tuple[str, str], ...]
    problem: str
    calls: int | None = None
    time_ms: float | None = None
    comment: Mapping[str, str] = field(default_factory=dict)

    def option(self, name: str) -> str | None:
        for key, value in self.options:
            if key == name:
                return value
        return None

    def key(self) -> tuple[str, tuple[tuple[str, str], ...], str]:
        """What identifies the problem (totals excluded)."""
        return self.driver, self.options, self.problem

    def args(self) -> list[str]:
        """The benchdnn arguments, driver switch first."""
        out = [f"--{self.driver}", "--reset"]
        out += [f"--{k}={v}" for k, v in self.options]
        out.append(self.problem)
        return out

    def text(self) -> str:
        line = " ".join(self.args())
        notes = []
        if self.calls is not None:
            notes.append(f"calls={self.calls}")
        if self.time_ms is not None:
            notes.append(f"time_ms={self.time_ms:.6g}")
            if self.calls:
                notes.append(f"avg_ms={self.time_ms / self.calls:.6g}")
        notes += [f"{k}={v}" for k, v in self.comment.items()]
        return f"{line} # {' '.join(notes)}" if notes else line


def _dts(*mds: MemoryDesc | None) -> str:
    values = [(md.dt or "f32") for md in mds if md is not None]
    if values and all(v == values[0] for v in values):
        return values[0]
    return ":".join(values)


def _tag(md: MemoryDesc | None) -> str | None:
    if md is None or not md.tag or md.tag == "undef":
        return None
    return md.tag


def benchdnn_line(row: Mapping[str, Any]) -> BatchLine:
    """The benchdnn problem for one row of the primitive table (its shape columns)."""
    driver = row["driver"] or row["prim_kind"]
    mds = parse_mds(row["mds"] or "")
    r = roles(mds)
    attrs = parse_attrs(row["attrs"] or "")
    aux = parse_aux(row.get("aux") or "")
    opts: list[tuple[str, str]] = []

    def add(name: str, value: str | None) -> None:
        if value not in (None, ""):
            opts.append((name, str(value)))

    engine = row.get("engine") or "cpu"
    if engine != "cpu":
        add("engine", engine)
    if driver == "rnn":
        add("prop", row.get("direction"))
    elif driver in _WITH_DIR:
        add("dir", row.get("direction"))
    if driver in COMPUTE_DRIVERS:
        add("dt", _dts(r.src, r.wei, r.dst))
        add("stag", _tag(r.src))
        add("wtag", _tag(r.wei))
        add("dtag", _tag(r.dst))
        if driver == "matmul" and r.bia is not None:
            add("bia_dt", r.bia.dt)
    elif driver in ("reorder", "softmax", "resampling", "reduction"):
        add("sdt", (r.src.dt or "f32") if r.src else None)
        add("ddt", (r.dst.dt or "f32") if r.dst else None)
        if driver == "resampling":
            add("tag", _tag(r.src))
        else:
            add("stag", _tag(r.src))
            add("dtag", _tag(r.dst))
    elif driver in ("binary", "sum", "concat"):
        srcs = r.srcs or ((r.src,) if r.src else ())
        add("sdt", ":".join(md.dt or "f32" for md in srcs) if driver != "concat" else _dts(*srcs))
        add("ddt", (r.dst.dt or "f32") if r.dst else None)
        add("stag", ":".join(_tag(md) or "any" for md in srcs) if srcs else None)
        add("dtag", _tag(r.dst))
    elif driver == "prelu":
        add("sdt", ":".join(md.dt or "f32" for md in (r.src, r.wei) if md is not None))
        add("stag", ":".join(_tag(md) or "any" for md in (r.src, r.wei) if md is not None))
    elif driver in ("pool", "lnorm"):
        add("dt", _dts(r.src, r.dst))
        add("tag", _tag(r.src))
    elif driver == "rnn":
        add("cfg", row.get("cfg"))
    else:  # eltwise, bnorm, gnorm, lrn, shuffle and drivers benchdnn may add
        add("dt", _dts(r.src))
        add("tag", _tag(r.src))
    if driver in _WITH_ALG:
        add("alg", benchdnn_alg(driver, row.get("alg") or aux.get("alg")))
    if driver == "eltwise":
        add("alpha", aux.get("alpha"))
        add("beta", aux.get("beta"))
    if driver in ("bnorm", "lnorm", "gnorm") and aux.get("flags", "").isalpha():
        add("flags", aux.get("flags"))
    if driver in ("softmax", "concat", "shuffle"):
        add("axis", aux.get("axis"))
    if driver == "shuffle":
        add("group", aux.get("group"))
    if driver == "reduction":
        add("p", aux.get("p"))
        add("eps", aux.get("eps"))
    add("attr-post-ops", attrs.post_ops)
    add("attr-scratchpad", attrs.get("scratchpad"))
    add("attr-fpmath", attrs.get("fpmath"))
    problem = row["problem"] or ""
    if driver in _CANONICAL:
        try:
            decoded = decode_problem(driver, problem)
            problem = encode_problem(driver, decoded.fields, decoded.ndims)
        except ProblemError:
            pass  # keep the descriptor exactly as the log printed it
    comment = {"impl": row["impl"]} if row.get("impl") else {}
    return BatchLine(driver, tuple(opts), problem, comment=comment)


def batch_lines(data: Union[pl.DataFrame, VerboseLog], event: str | None = "exec") -> list[BatchLine]:
    """One :class:`BatchLine` per distinct benchdnn problem, most total time first.

    Rows of a primitive kind the parser does not know (``ParseReport.unknown_kinds``)
    have no benchdnn driver and are left out.
    """
    if isinstance(data, VerboseLog):
        totals = data.shape_totals(event)
    else:
        cols = [c for c in SHAPE_COLUMNS if c in data.columns]
        totals = filter_event(data.lazy(), event).group_by(cols).agg(
            pl.len().cast(pl.Int64).alias("ncalls"), pl.col("time_ms").sum()
        ).collect()
    merged: dict[tuple, list[Any]] = {}
    for row in totals.iter_rows(named=True):
        if row["prim_kind"] not in PRIM_KIND_TO_DRIVER:
            continue
        line = benchdnn_line(row)
        slot = merged.setdefault(line.key(), [line, 0, 0.0])
        slot[1] += int(row["ncalls"])
        slot[2] += float(row["time_ms"] or 0.0)
    out = [
        BatchLine(line.driver, line.options, line.problem, calls, time_ms, line.comment)
        for line, calls, time_ms in merged.values()
    ]
    return sorted(out, key=lambda b: (-(b.time_ms or 0.0), b.driver, b.problem))


def format_batch(lines: Iterable[BatchLine], header: bool = True) -> str:
    body = "".join(line.text() + "\n" for line in lines)
    return (HEADER if header else "") + body


def write_batch(data: Union[pl.DataFrame, VerboseLog], path: Union[str, os.PathLike], event: str | None = "exec") -> Path:
    """Write the batch file for ``data`` atomically; returns its path."""
    path = Path(path)
    atomic_write_text(path, format_batch(batch_lines(data, event)))
    return path


def parse_batch(text: str) -> list[BatchLine]:
    """Read a batch file in :func:`format_batch`'s format back into :class:`BatchLine` s."""
    out: list[BatchLine] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        code, _, note = raw.partition(" #")
        code = code.strip()
        if not code or code.startswith("#"):
            continue
        tokens = shlex.split(code)
        if not tokens[0].startswith("--") or "=" in tokens[0]:
            raise ValueError(f"line {number}: expected a driver switch first, got {tokens[0]!r}")
        driver = tokens[0][2:]
        options: list[tuple[str, str]] = []
        problem = None
        for tok in tokens[1:]:
            if tok == "--reset":
                continue
            if tok.startswith("--"):
                name, eq, value = tok[2:].partition("=")
                if not eq:
                    raise ValueError(f"line {number}: option {tok!r} has no value")
                options.append((name, value))
            elif problem is None:
                problem = tok
            else:
                raise ValueError(f"line {number}: two problem descriptors ({problem!r}, {tok!r})")
        if problem is None:
            raise ValueError(f"line {number}: no problem descriptor")
        comment = dict(item.split("=", 1) for item in note.split() if "=" in item)
        calls = int(comment.pop("calls")) if "calls" in comment else None
        time_ms = float(comment.pop("time_ms")) if "time_ms" in comment else None
        comment.pop("avg_ms", None)
        out.append(BatchLine(driver, tuple(options), problem, calls, time_ms, comment))
    return out

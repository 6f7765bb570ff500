"""Decode one distinct verbose line shape into the primitive table's columns.

The scan reduces every verbose line to a header code and a *key*: the text after the
version and timestamp fields up to the last comma (component, event, engine, primitive
kind, implementation, prop kind, tensors, attributes, auxiliary fields, problem). A million-line log holds a few hundred distinct
keys, so each is decoded here once, in plain Python, into a :class:`Primitive` (the IR
every generator -- the table, the benchdnn batch file -- reads).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from .attrs import Attributes, parse_attrs, parse_aux
from .dialects import (
    COMPONENT_NAMES, GRAPH, GRAPH_MARKERS, MALFORMED, MARKER_DNNL, MARKER_MKLDNN,
    PRIM_KIND_TO_DRIVER, PRIMITIVE, PROP_KINDS, benchdnn_direction, classify_event, isa_of, unpack_prefix,
)
from .mds import MemoryDesc, parse_mds, roles
from .metrics import benchdnn_cfg, flops, traffic_bytes
from .problem import Problem, ProblemError, decode_problem
from .fields import CONV_FIELDS

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_ENGINE = re.compile(r"^[a-z][a-z0-9]*(?::\d+)?$")


@dataclass(frozen=True)
class Primitive:
    """One distinct primitive line shape, decoded (the parser's intermediate form)."""

    dialect: str
    event: str
    engine: str
    prim_kind: str
    driver: str
    impl: str | None
    prop_kind: str
    mds_text: str
    attrs_text: str
    aux_text: str
    problem_text: str
    mds: tuple[MemoryDesc, ...]
    attrs: Attributes
    aux: dict[str, str]
    problem: Problem | None
    direction: str | None
    cfg: str | None
    isa: str | None
    flops: float | None
    flops_dense: float | None
    bytes: float | None
    # The columns that do not depend on dialect and event, computed once per shape.
    body_columns: dict[str, Any] | None = field(default=None, compare=False, repr=False)

    def columns(self) -> dict[str, Any]:
        """The primitive table's columns this shape determines (all but line/time)."""
        if self.body_columns is not None:
            return {**self.body_columns, "dialect": self.dialect, "event": self.event}
        r = roles(self.mds)
        f = dict(self.problem.fields) if self.problem else {}
        out: dict[str, Any] = {
            "dialect": self.dialect,
            "event": self.event,
            "engine": self.engine,
            "driver": self.driver,
            "prim_kind": self.prim_kind,
            "impl": self.impl,
            "isa": self.isa,
            "prop_kind": self.prop_kind,
            "direction": self.direction,
            "cfg": self.cfg,
            "src_dt": (r.src.dt or "f32") if r.src else None,
            "wei_dt": (r.wei.dt or "f32") if r.wei else None,
            "dst_dt": (r.dst.dt or "f32") if r.dst else None,
            "src_tag": r.src.tag if r.src else None,
            "wei_tag": r.wei.tag if r.wei else None,
            "dst_tag": r.dst.tag if r.dst else None,
            "mds": self.mds_text,
            "attrs": self.attrs_text,
            "aux": self.aux_text,
            "post_ops": self.attrs.post_ops,
            "alg": self.aux.get("alg") or None,
            "problem": self.problem_text,
        }
        for name in CONV_FIELDS:
            out[name] = f.get(name)
        for name in ("m", "n", "k", "batch"):
            out[name] = f.get(name)
        out["dims"] = self.problem.dims if self.problem else None
        out["flops"] = self.flops
        out["flops_dense"] = self.flops_dense
        out["bytes"] = self.bytes
        return out


def _evolve(prim: Primitive, **changes: Any) -> Primitive:
    """``dataclasses.replace`` without re-running ``__init__``: a log has hundreds of
    shapes, and ``profilednn breakdown`` decodes each one at start-up."""
    new = object.__new__(Primitive)
    new.__dict__.update(prim.__dict__, **changes)
    return new


@dataclass(frozen=True)
class KeyInfo:
    """What one distinct key is: its line class and, for primitives, the decoded shape."""

    line_class: str
    dialect: str | None
    event: str
    primitive: Primitive | None = None
    reason: str | None = None          # why a primitive-looking line is malformed
    time: float | None = None          # the time when it sits inside the key (extra fields)
    note: str | None = None            # "extra_fields", "undecoded_problem", "unreadable_mds"
    note_detail: str | None = None
    # The integer part of a decimal-comma time (MKL-DNN 0.x on a comma locale prints
    # 9.4747 ms as ``,9,4747``): each line's last field then holds the fraction.
    time_int: int | None = None
    unknown_kind: str | None = None    # a primitive kind ProfileDNN does not know (kept as a row)


def _dialect(marker: int, has_version: bool, component: bool, event: str, body: list[str]) -> str:
    if marker == MARKER_MKLDNN:
        return "mkldnn_v0"
    if marker == MARKER_DNNL:
        return "dnnl_v1"
    if has_version:
        return "onednn_v3.6"
    if component:
        return "onednn_v3.3"
    if event in ("create:check", "create:dispatch"):
        return "onednn_v3.2"
    # A strides field in the tensors (src_f32::blocked:ab::f0) appeared with oneDNN 3.x.
    if len(body) > 4:
        first = body[4].split(" ", 1)[0]
        parts = first.split(":")
        if len(parts) >= 6 and "_" in parts[0]:
            return "onednn_v3.2"
    return "onednn_v2.5"


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def decode_key(prefix: int, key: str) -> KeyInfo:
    """Classify and (for primitive lines) decode one distinct key."""
    marker, has_version = unpack_prefix(prefix)
    fields = key.split(",")
    comp_name = ""
    if len(fields) > 1 and fields[0] in COMPONENT_NAMES[1:]:
        comp_name, fields = fields[0], fields[1:]
    event, body = fields[0], fields[1:]
    if marker in GRAPH_MARKERS:
        return KeyInfo(GRAPH, None, event)
    dialect = _dialect(marker, has_version, bool(comp_name), event, body)
    cls = classify_event(event, comp_name, body[0] if body else "")
    if cls != PRIMITIVE:
        return KeyInfo(cls, dialect, event)
    return _decode_primitive(dialect, event, body)


def _malformed(dialect: str, event: str, reason: str) -> KeyInfo:
    return KeyInfo(MALFORMED, dialect, event, reason=reason)


def _unknown_kind_row(dialect: str, event: str, engine: str, kind: str) -> KeyInfo:
    """A primitive line of a kind (or layout) the decoder does not know: kept as a row
    with its engine, kind and time so no time is lost; nothing else is decoded."""
    prim_obj = Primitive(
        dialect=dialect, event=event, engine=engine, prim_kind=kind, driver=kind, impl=None,
        prop_kind="undef", mds_text="", attrs_text="", aux_text="", problem_text="", mds=(),
        attrs=parse_attrs(""), aux={}, problem=None, direction=None, cfg=None, isa=None,
        flops=None, flops_dense=None, bytes=None,
    )
    return KeyInfo(PRIMITIVE, dialect, event, prim_obj, unknown_kind=kind)


def _unknown_layout(dialect: str, event: str, body: list[str]) -> KeyInfo | None:
    """The unknown-kind row for a line whose fields do not follow the primitive layout,
    when it still names an engine and a kind that is not a known one: the kind right
    after the engine, or after a numeric id there (``gpu,100002,sdp,...``, a fused
    partition). None when the line is simply broken (then it is malformed)."""
    if dialect == "mkldnn_v0" or len(body) < 2 or not _ENGINE.match(body[0]):
        return None
    kind = body[1]
    if kind.isdigit() and len(body) > 2:
        kind = body[2]
    if not _NAME.match(kind) or kind in PRIM_KIND_TO_DRIVER:
        return None
    return _unknown_kind_row(dialect, event, body[0], kind)


def _decimal_comma_int(body: list[str], expected: int) -> int | None:
    """The integer part when the only field past the layout is all digits: the line
    ends ``,<int>,<fraction>`` -- a time printed with a decimal comma."""
    if len(body) == expected + 1 and body[expected].isdigit():
        return int(body[expected])
    return None


def _decode_primitive(dialect: str, event: str, body: list[str]) -> KeyInfo:
    if dialect == "mkldnn_v0":
        has_impl = len(body) > 1 and body[1] not in PROP_KINDS
        expected = 6 if has_impl else 5
        if len(body) < expected:
            return _malformed(dialect, event, f"expected {expected + 1} fields after the event, found {len(body) + 1}")
        if has_impl:
            prim, impl, prop, mds_text, aux_text, problem = body[:6]
        else:
            prim, prop, mds_text, aux_text, problem = body[:5]
            impl = None
        engine, attrs_text = "cpu", ""
    else:
        expected = 8
        if len(body) == 7 and dialect == "dnnl_v1":  # DNNL 1.0/1.1: no attribute field
            expected = 7
            engine, prim, impl, prop, mds_text, aux_text, problem = body
            attrs_text = ""
        elif len(body) == 7 and body[1] == "gemm_api":  # oneDNN 2.7: sgemm API lines, no aux field
            expected = 7
            engine, prim, impl, prop, mds_text, attrs_text, problem = body
            aux_text = ""
        elif len(body) < 8:
            unknown = _unknown_layout(dialect, event, body)
            if unknown is not None:
                return unknown
            return _malformed(dialect, event, f"expected {expected + 1} fields after the event, found {len(body) + 1}")
        else:
            engine, prim, impl, prop, mds_text, attrs_text, aux_text, problem = body[:8]
        if not _ENGINE.match(engine):
            return _malformed(dialect, event, f"engine field {engine[:40]!r} is not an engine")
    time = None
    note = detail = None
    time_int = _decimal_comma_int(body, expected)
    if len(body) > expected and time_int is None:
        time = _float(body[expected])
        if time is None:
            unknown = _unknown_layout(dialect, event, body)
            if unknown is not None:
                return unknown
            return _malformed(dialect, event, f"time field {body[expected][:40]!r} is not a number")
        note, detail = "extra_fields", f"{len(body) - expected} extra field(s) after the time"
    if not _NAME.match(prim):
        unknown = _unknown_layout(dialect, event, body)
        if unknown is not None:
            return unknown
        return _malformed(dialect, event, f"primitive kind {prim[:40]!r} is not a name")
    if not _NAME.match(prop):
        return _malformed(dialect, event, f"prop kind {prop[:40]!r} is not a name")
    template, body_note, body_detail = _decode_fields(engine, prim, impl, prop, mds_text, attrs_text, aux_text, problem)
    if body_note:
        note, detail = body_note, body_detail
    prim_obj = _evolve(template, dialect=dialect, event=event)
    unknown_kind = None if prim in PRIM_KIND_TO_DRIVER else prim
    return KeyInfo(PRIMITIVE, dialect, event, prim_obj, time=time, note=note, note_detail=detail,
                   time_int=time_int, unknown_kind=unknown_kind)


@lru_cache(maxsize=8192)
def _decode_fields(
    engine: str, prim: str, impl: str | None, prop: str, mds_text: str, attrs_text: str, aux_text: str,
    problem: str,
) -> tuple[Primitive, str | None, str | None]:
    """Decode the fields after the event, once: the exec and create lines of a primitive,
    and the dialects that print it alike, share them. Returns the shape (dialect and
    event blank), and the note and its detail when something could not be decoded."""
    note = detail = None
    try:
        mds = parse_mds(mds_text.strip())
    except ValueError as exc:
        mds = ()
        note, detail = "unreadable_mds", str(exc)
    attrs = parse_attrs(attrs_text.strip())
    aux = parse_aux(aux_text.strip())
    driver = PRIM_KIND_TO_DRIVER.get(prim, prim)
    r = roles(mds)
    has_bias = r.bia is not None
    direction = benchdnn_direction(prop, driver, has_bias)
    problem_text = problem.strip()
    decoded: Problem | None
    try:
        decoded = decode_problem(driver, problem_text)
    except ProblemError as exc:
        decoded = None
        note, detail = "undecoded_problem", str(exc)
    fl, fl_dense = flops(decoded)
    prim_obj = Primitive(
        dialect="", event="", engine=engine, prim_kind=prim, driver=driver,
        impl=impl, prop_kind=prop, mds_text=mds_text.strip(), attrs_text=attrs_text.strip(),
        aux_text=aux_text.strip(), problem_text=problem_text, mds=mds, attrs=attrs, aux=aux,
        problem=decoded, direction=direction, cfg=benchdnn_cfg(driver, r), isa=isa_of(impl, engine),
        flops=fl, flops_dense=fl_dense,
        bytes=traffic_bytes(decoded, direction, r, mds, attrs.post_ops, aux),
    )
    return _evolve(prim_obj, body_columns=prim_obj.columns()), note, detail

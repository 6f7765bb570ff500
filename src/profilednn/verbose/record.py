"""Decode one distinct verbose line shape into the primitive table's columns.

The scan reduces every verbose line to a header code and a *key*: the text after the
version and timestamp fields up to the last comma (component, event, engine, primitive
kind, implementation, prop kind, tensors, attributes, auxiliary fields, problem). A million-line log holds a few hundred distinct
keys, so each is decoded here once, in plain Python, into a :class:`Primitive` (the IR
every generator -- the table, the benchdnn batch file -- reads).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .attrs import Attributes, parse_attrs, parse_aux
from .dialects import (
    COMPONENT_NAMES, GRAPH, GRAPH_MARKERS, MALFORMED, MARKER_DNNL, MARKER_MKLDNN,
    PRIM_KIND_TO_DRIVER, PRIMITIVE, PROP_KINDS, benchdnn_direction, classify_event, isa_of,
)
from .mds import MemoryDesc, parse_mds, roles
from .metrics import benchdnn_cfg, flops, traffic_bytes
from .problem import Problem, ProblemError, decode_problem
from .scan import unpack_prefix
from .schema import CONV_FIELDS

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

    def columns(self) -> dict[str, Any]:
        """The primitive table's columns this shape determines (all but line/time)."""
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
        elif len(body) < 8:
            return _malformed(dialect, event, f"expected {expected + 1} fields after the event, found {len(body) + 1}")
        else:
            engine, prim, impl, prop, mds_text, attrs_text, aux_text, problem = body[:8]
        if not _ENGINE.match(engine):
            return _malformed(dialect, event, f"engine field {engine[:40]!r} is not an engine")
    time = None
    note = detail = None
    if len(body) > expected:
        time = _float(body[expected])
        if time is None:
            return _malformed(dialect, event, f"time field {body[expected][:40]!r} is not a number")
        note, detail = "extra_fields", f"{len(body) - expected} extra field(s) after the time"
    if not _NAME.match(prim):
        return _malformed(dialect, event, f"primitive kind {prim[:40]!r} is not a name")
    if not _NAME.match(prop):
        return _malformed(dialect, event, f"prop kind {prop[:40]!r} is not a name")
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
        dialect=dialect, event=event, engine=engine, prim_kind=prim, driver=driver,
        impl=impl, prop_kind=prop, mds_text=mds_text.strip(), attrs_text=attrs_text.strip(),
        aux_text=aux_text.strip(), problem_text=problem_text, mds=mds, attrs=attrs, aux=aux,
        problem=decoded, direction=direction, cfg=benchdnn_cfg(driver, r), isa=isa_of(impl, engine),
        flops=fl, flops_dense=fl_dense,
        bytes=traffic_bytes(decoded, direction, r, mds, attrs.post_ops, aux),
    )
    return KeyInfo(PRIMITIVE, dialect, event, prim_obj, time=time, note=note, note_detail=detail)

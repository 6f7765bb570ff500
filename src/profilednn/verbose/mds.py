"""Memory descriptors: the space-separated tensor list of a verbose line.

Four spellings exist, told apart per descriptor (so mixed logs decode):

* oneDNN >= 3.6 ``src:f32:a:blocked:abcd::f0`` -- ``arg:dt:props:kind:tag:strides:flags``;
* oneDNN 3.x   ``src_f32:a:blocked:abcd::f0``  -- ``arg_dt:props:kind:tag:strides:flags``;
* DNNL 1.x/2.x ``src_f32::blocked:abcd:f0``    -- ``arg_dt:props:kind:tag:flags``;
* MKL-DNN 0.x  ``fsrc:nchw`` (no data type) and ``in:f32_nchw`` (reorder).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .dialects import DT_BYTES, is_data_type

# Argument names by role. MKL-DNN 0.x prefixes its format list with ``f``.
SRC_ARGS = ("src", "diff_src", "src0", "src_0", "data", "diff_data", "src_layer", "diff_src_layer", "in", "input")
WEI_ARGS = ("wei", "diff_wei", "weights", "diff_weights", "wei_layer", "diff_wei_layer")
DST_ARGS = ("dst", "diff_dst", "dst_layer", "diff_dst_layer", "out", "output")
BIAS_ARGS = ("bia", "diff_bia", "bias", "diff_bias")
_V0_ARGS = {"fsrc": "src", "fwei": "wei", "fbia": "bia", "fdst": "dst", "fdiff_src": "diff_src",
            "fdiff_dst": "diff_dst", "fdiff_wei": "diff_wei", "fdata": "data", "fdiff": "diff",
            "fws": "ws", "fdiff_bia": "diff_bia"}


@dataclass(frozen=True)
class MemoryDesc:
    """One tensor of a primitive as the verbose line describes it."""

    arg: str
    dt: str | None          # None: the dialect prints no data type (MKL-DNN 0.x formats)
    tag: str                # format tag ("abcd", "aBcd8b", "nchw"); "" when none
    format_kind: str = ""   # blocked, any, undef, wino, ...
    properties: str = ""
    strides: str = ""
    flags: str = ""

    @property
    def defined(self) -> bool:
        """False for a placeholder (``bia:undef::undef:::``): the tensor does not exist."""
        return self.dt != "undef" and self.format_kind != "undef" and self.tag != "undef"

    @property
    def itemsize(self) -> float:
        """Bytes per element (f32 assumed where the dialect prints no data type)."""
        return DT_BYTES.get(self.dt or "f32", 4.0)


def _split_arg_dt(text: str) -> tuple[str, str] | None:
    """``src_f32`` -> (``src``, ``f32``); ``diff_src_f8_e5m2`` -> (``diff_src``, ``f8_e5m2``)."""
    parts = text.split("_")
    for i in range(1, len(parts)):
        dt = "_".join(parts[i:])
        if is_data_type(dt):
            return "_".join(parts[:i]), dt
    if len(parts) == 1 and is_data_type(text):
        return "data", text
    return None


def parse_md(text: str) -> MemoryDesc:
    """Parse one descriptor in any dialect; raises ValueError when it is none of them."""
    parts = text.split(":")
    if len(parts) >= 5 and is_data_type(parts[1]) and _split_arg_dt(parts[0]) is None:
        # arg:dt:props:kind:tag:strides:flags (oneDNN >= 3.6)
        rest = parts[5:]
        return MemoryDesc(parts[0], parts[1], parts[4], parts[3], parts[2],
                          rest[0] if len(rest) > 1 else "", ":".join(rest[1:] if len(rest) > 1 else rest))
    if len(parts) >= 4:
        split = _split_arg_dt(parts[0])
        if split is None:
            raise ValueError(f"cannot read memory descriptor {text!r}")
        arg, dt = split
        tail = parts[4:]
        if tail and not tail[0].startswith("f") and parts[2] != "undef" and len(tail) > 1:
            strides, flags = tail[0], ":".join(tail[1:])
        elif len(tail) > 1 and tail[0] == "":
            strides, flags = "", ":".join(tail[1:])
        else:
            strides, flags = "", ":".join(tail)
        return MemoryDesc(arg, dt, parts[3], parts[2], parts[1], strides, flags)
    if len(parts) == 2:
        # MKL-DNN 0.x: fsrc:nchw, in:f32_nchw, out:f32_nChw8c
        arg = _V0_ARGS.get(parts[0], parts[0])
        value = parts[1]
        dt: str | None = None
        tag = value
        if "_" in value:
            head, _, rest = value.partition("_")
            if is_data_type(head):
                dt, tag = head, rest
        if tag == "undef":
            return MemoryDesc(arg, "undef", "undef", "undef")
        return MemoryDesc(arg, dt, tag, "blocked")
    raise ValueError(f"cannot read memory descriptor {text!r}")


@lru_cache(maxsize=8192)
def parse_mds(field: str) -> tuple[MemoryDesc, ...]:
    """All descriptors of a verbose line's tensor field."""
    return tuple(parse_md(tok) for tok in field.split())


def _first(mds: tuple[MemoryDesc, ...], names: tuple[str, ...]) -> MemoryDesc | None:
    for name in names:
        for md in mds:
            if md.arg == name and md.defined:
                return md
    return None


@dataclass(frozen=True)
class Roles:
    """The tensors that play source, weights, bias and destination."""

    src: MemoryDesc | None
    wei: MemoryDesc | None
    bia: MemoryDesc | None
    dst: MemoryDesc | None
    srcs: tuple[MemoryDesc, ...]  # every source (binary, sum, concat take several)


def roles(mds: tuple[MemoryDesc, ...]) -> Roles:
    src = _first(mds, SRC_ARGS)
    dst = _first(mds, DST_ARGS)
    if dst is None and src is not None and src.arg in ("data", "diff_data"):
        dst = src  # eltwise / bnorm / lnorm print one "data" tensor for src and dst
    srcs = tuple(md for md in mds if md.arg in ("src", "src0", "src1", "src_0", "src_1", "in", "data") and md.defined)
    return Roles(src, _first(mds, WEI_ARGS), _first(mds, BIAS_ARGS), dst, srcs)

"""Problem descriptors in benchdnn's syntax: decode into Table-2 fields, encode back.

A descriptor is the ``problem_desc`` field of a verbose line and the last word of a
benchdnn command line. Three families exist:

* named fields -- convolution / deconvolution / pooling (``mb2_g4ic16oc16_ih7oh7kh3sh1dh0ph1``
  ...), inner product (``mb2ic16oc10``), batch/layer/group normalization, LRN, RNN
  (``l1t1mb1sic16...``). Omitted fields take benchdnn's defaults (``mb2``, ``g1``, unit
  strides, no dilation, square/cubic shapes, outputs and paddings deduced);
* matmul -- ``[b..x]MxK:[b..x]KxN[:[b..x]MxN]``; non-numeric dims are runtime dims;
* plain dims -- ``2x16x7x7`` (eltwise, reorder, softmax ...) or several joined by ``:``
  (binary, concat, sum, prelu, reduction).

:func:`decode_problem` returns a :class:`Problem`; :func:`encode_problem` writes the
canonical descriptor (the form oneDNN's verbose output uses) from the fields.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Mapping

from ..vocabulary import CONV_DRIVERS
from .fields import CONV_FIELDS

NAMED_DRIVERS = frozenset({"conv", "deconv", "pool", "ip", "bnorm", "gnorm", "lrn", "resampling", "rnn"})
SPATIAL = ("d", "h", "w")

# benchdnn's conv / pool descriptor keys, tried in this order (each followed by digits).
_CONV_KEYS = (
    "g", "mb", "ic", "id", "ih", "iw", "oc", "od", "oh", "ow", "kd", "kh", "kw",
    "sd", "sh", "sw", "pd", "ph", "pw", "dd", "dh", "dw",
)
_GENERIC_TOKEN = re.compile(r"([a-z_]+?)(-?\d+(?:\.\d*)?(?:e[+-]?\d+)?)(?=[a-z_]|$)")
_DIM_TOKEN = re.compile(r"^(?:\d+|[*?]|-\d+)$")


class ProblemError(ValueError):
    """A descriptor that benchdnn would reject."""


MAX_DIM = 2**40  # larger values are garbage, not tensors


def _checked(value: int, text: str) -> int:
    if abs(value) > MAX_DIM:
        raise ProblemError(f"value {value} out of range in descriptor {text!r}")
    return value


@dataclass(frozen=True)
class Problem:
    """A decoded descriptor.

    ``fields`` holds Table-2 fields (``mb``, ``ic``, ``oh`` ... and ``m``, ``n``, ``k``,
    ``batch``) where the driver defines them; ``tensors`` the dims of each tensor the
    descriptor names (``None`` for a runtime dim), used to size memory traffic;
    ``ndims`` the number of dims of the main tensor (spatial dims + 2 for conv-like).
    """

    driver: str
    fields: Mapping[str, int | None] = field(default_factory=dict)
    tensors: tuple[tuple[int | None, ...], ...] = ()
    ndims: int | None = None
    name: str | None = None

    @property
    def dims(self) -> str | None:
        """The main tensor's dims as ``AxBxC`` (``?`` for runtime dims)."""
        if not self.tensors:
            return None
        return "x".join("?" if d is None else str(d) for d in self.tensors[0])


# -- named-field descriptors (conv, deconv, pool) -------------------------------------
def _tokenize_conv(text: str, keys: tuple[str, ...]) -> tuple[dict[str, int], str | None]:
    values: dict[str, int] = {}
    i, n = 0, len(text)
    name = None
    while i < n:
        c = text[i]
        if c == "_":
            i += 1
            continue
        for key in keys:
            if text.startswith(key, i) and i + len(key) < n and text[i + len(key)].isdigit():
                j = i + len(key)
                while j < n and text[j].isdigit():
                    j += 1
                values[key] = _checked(int(text[i + len(key) : j]), text)
                i = j
                break
        else:
            if c == "n":
                name = text[i + 1 :].strip('"') or None
                break
            raise ProblemError(f"unexpected {text[i:i + 8]!r} in descriptor {text!r}")
    return values, name


def _ext(k: int, d: int) -> int:
    return (k - 1) * (d + 1) + 1


def _out_size(i: int, k: int, s: int, p: int, d: int, deconv: bool) -> int:
    if deconv:
        return (i - 1) * s + _ext(k, d) - 2 * p
    return (i - _ext(k, d) + 2 * p) // s + 1


def _pad_size(o: int, i: int, k: int, s: int, d: int, deconv: bool) -> int:
    if deconv:
        return ((i - 1) * s - o + _ext(k, d)) // 2
    return ((o - 1) * s - i + _ext(k, d)) // 2


def _pad_right(i: int, o: int, k: int, s: int, p: int, d: int, deconv: bool) -> int:
    if deconv:
        return (i - 1) * s - o + _ext(k, d) - p
    return (o - 1) * s - i + _ext(k, d) - p


def _decode_spatial(v: dict[str, int], text: str, deconv: bool) -> tuple[dict[str, int], int]:
    """benchdnn's ``str2desc`` rules: deduce outputs/paddings, propagate square shapes."""
    for a in SPATIAL:
        v.setdefault("s" + a, 1)
        v.setdefault("p" + a, -1)
        for key in ("i", "o", "k", "d"):
            v.setdefault(key + a, 0)
    if any(v["s" + a] <= 0 for a in SPATIAL):
        raise ProblemError(f"non-positive stride in {text!r}")
    present = {}
    for a in SPATIAL:
        absent = (v["i" + a] | v["k" + a] | v["o" + a] | v["d" + a]) == 0 and v["s" + a] == 1 and v["p" + a] < 1
        present[a] = not absent
        if absent:
            continue
        if not v["i" + a] or not v["k" + a]:
            raise ProblemError(f"{text!r} needs both i{a} and k{a}")
        if not v["o" + a]:
            v["p" + a] = max(v["p" + a], 0)
            v["o" + a] = _out_size(v["i" + a], v["k" + a], v["s" + a], v["p" + a], v["d" + a], deconv)
            if v["o" + a] <= 0:
                raise ProblemError(f"{text!r} gives a non-positive o{a}")
        elif v["p" + a] < 0:
            v["p" + a] = _pad_size(v["o" + a], v["i" + a], v["k" + a], v["s" + a], v["d" + a], deconv)
    no_d, no_h, no_w = (v["o" + a] == 0 for a in SPATIAL)
    ndims = 5 - int(no_d) - int(no_d and no_h) - int(no_d and no_h and no_w)
    if ndims <= 2:
        raise ProblemError(f"{text!r} has no spatial dimension")
    keys = ("o", "i", "k", "s", "p", "d")
    if ndims == 5:
        if no_h and no_w:
            for key in keys:
                v[key + "h"] = v[key + "w"] = v[key + "d"]
        elif no_h or no_w:
            raise ProblemError(f"{text!r} gives d and only one of h, w")
    elif ndims == 4 and no_w:
        for key in keys:
            v[key + "w"] = v[key + "h"]
    defaults = {"o": 1, "i": 1, "k": 1, "s": 1, "p": 0, "d": 0}
    for a, lowest in (("d", 5), ("h", 4), ("w", 3)):
        if ndims < lowest:
            for key, dv in defaults.items():
                v[key + a] = dv
    for a in SPATIAL:
        v["p" + a] = max(v["p" + a], 0)
        v[f"p{a}_r"] = _pad_right(v["i" + a], v["o" + a], v["k" + a], v["s" + a], v["p" + a], v["d" + a], deconv)
    return v, ndims


def _spatial_dims(v: Mapping[str, int | None], prefix: str, ndims: int) -> tuple[int | None, ...]:
    return tuple(v[prefix + a] for a in SPATIAL[5 - ndims :])


def _decode_conv(driver: str, text: str) -> Problem:
    v, name = _tokenize_conv(text, _CONV_KEYS)
    has_groups = "g" in v
    v.setdefault("g", 1)
    v.setdefault("mb", 2)
    if v.get("ic", 0) <= 0 or v.get("oc", 0) <= 0:
        raise ProblemError(f"{text!r} needs positive ic and oc")
    if v["g"] <= 0 or v["ic"] % v["g"] or v["oc"] % v["g"]:
        raise ProblemError(f"{text!r}: groups must divide ic and oc")
    v, ndims = _decode_spatial(v, text, driver == "deconv")
    g, mb, ic, oc = v["g"], v["mb"], v["ic"], v["oc"]
    src = (mb, ic, *_spatial_dims(v, "i", ndims))
    wei = ((g,) if has_groups or g > 1 else ()) + (oc // g, ic // g, *_spatial_dims(v, "k", ndims))
    dst = (mb, oc, *_spatial_dims(v, "o", ndims))
    fields = {k: v[k] for k in CONV_FIELDS}
    return Problem(driver, fields, (src, wei, (oc,), dst), ndims, name)


def _decode_pool(text: str) -> Problem:
    keys = tuple(k for k in _CONV_KEYS if k not in ("g", "oc"))
    v, name = _tokenize_conv(text, keys)
    v.setdefault("mb", 2)
    if v.get("ic", 0) <= 0:
        raise ProblemError(f"{text!r} needs a positive ic")
    v, ndims = _decode_spatial(v, text, False)
    fields = {k: v[k] for k in CONV_FIELDS if k not in ("g", "oc")}
    mb, ic = v["mb"], v["ic"]
    src = (mb, ic, *_spatial_dims(v, "i", ndims))
    dst = (mb, ic, *_spatial_dims(v, "o", ndims))
    return Problem("pool", fields, (src, dst), ndims, name)


def _generic_tokens(text: str) -> tuple[dict[str, float], str | None]:
    body = text.replace("_", "")
    name = None
    m = re.search(r'n"([^"]*)"$', body)
    if m:
        name, body = m.group(1), body[: m.start()]
    values: dict[str, float] = {}
    pos = 0
    for tok in _GENERIC_TOKEN.finditer(body):
        if tok.start() != pos:
            raise ProblemError(f"unexpected {body[pos:pos + 8]!r} in descriptor {text!r}")
        value = float(tok.group(2))
        if not abs(value) <= MAX_DIM:  # also rejects inf and nan
            raise ProblemError(f"value {tok.group(2)!r} out of range in descriptor {text!r}")
        values[tok.group(1)] = value
        pos = tok.end()
    if pos != len(body):
        rest = body[pos:]
        if rest.startswith("n"):
            name = rest[1:] or None
        else:
            raise ProblemError(f"unexpected {rest[:8]!r} in descriptor {text!r}")
    return values, name


def _ival(v: Mapping[str, float], key: str, default: int | None = None) -> int | None:
    x = v.get(key)
    return default if x is None else int(x)


def _decode_ip(text: str) -> Problem:
    v, name = _generic_tokens(text)
    mb, ic, oc = _ival(v, "mb", 2), _ival(v, "ic"), _ival(v, "oc")
    if not ic or not oc:
        raise ProblemError(f"{text!r} needs ic and oc")
    sp = {a: _ival(v, "i" + a) for a in SPATIAL}
    if sp["d"] and not sp["h"]:
        sp["h"] = sp["w"] = sp["d"]
    if sp["h"] and not sp["w"]:
        sp["w"] = sp["h"]
    ndims = 2 + sum(1 for a in SPATIAL if sp[a])
    spatial = tuple(sp[a] for a in SPATIAL if sp[a])
    k = ic * math.prod(spatial)
    fields: dict[str, int | None] = {
        "mb": mb, "ic": ic, "oc": oc, "id": sp["d"], "ih": sp["h"], "iw": sp["w"],
        "m": mb, "n": oc, "k": k, "batch": 1,
    }
    return Problem("ip", fields, ((mb, ic, *spatial), (oc, ic, *spatial), (oc,), (mb, oc)), ndims, name)


def _parse_dims(part: str, text: str) -> tuple[int | None, ...]:
    dims = part.split("x")
    if not dims or any(not _DIM_TOKEN.match(d) for d in dims):
        raise ProblemError(f"bad dims {part!r} in {text!r}")
    return tuple(_checked(int(d), text) if d.isdigit() else None for d in dims)


_NAMED_DIMS = re.compile(r'^([0-9x:*?\-]+?)_?(?:n"?([^"]*)"?)?$')


def _split_name(text: str) -> tuple[str, str | None]:
    """Split a trailing benchdnn name (``n"resnet:conv1"``) off a dims descriptor."""
    m = _NAMED_DIMS.match(text)
    if not m:
        return text, None
    return m.group(1), m.group(2) or None


def _decode_matmul(text: str) -> Problem:
    body, name = _split_name(text)
    if ":" not in body:
        v, name2 = _generic_tokens(body)
        m, n, k = _ival(v, "m"), _ival(v, "n"), _ival(v, "k")
        if m is None or n is None or k is None:
            raise ProblemError(f"{text!r} is not a matmul descriptor")
        b = _ival(v, "mb", None) or _ival(v, "b", 1) or 1
        src, wei, dst = (b, m, k), (b, k, n), (b, m, n)
        fields = {"m": m, "n": n, "k": k, "batch": b, "mb": None}
        return Problem("matmul", fields, (src, wei, dst), 3, name or name2)
    parts = body.split(":")
    if len(parts) not in (2, 3):
        raise ProblemError(f"{text!r}: matmul takes src:wei[:dst]")
    src, wei = _parse_dims(parts[0], text), _parse_dims(parts[1], text)
    if len(src) < 2 or len(wei) < 2 or len(src) != len(wei):
        raise ProblemError(f"{text!r}: src and weights need the same rank >= 2")
    if len(parts) == 3:
        dst = _parse_dims(parts[2], text)
        if len(dst) != len(src):
            raise ProblemError(f"{text!r}: dst rank differs from src")
    else:
        bd = tuple(
            None if (a is None or b is None) else max(a, b) for a, b in zip(src[:-2], wei[:-2])
        )
        dst = (*bd, src[-2], wei[-1])
    m, k, n = src[-2], src[-1], wei[-1]
    if k is not None and wei[-2] is not None and k != wei[-2]:
        raise ProblemError(f"{text!r}: K of src ({k}) and weights ({wei[-2]}) differ")
    if k is None:
        k = wei[-2]
    batch_dims = dst[:-2]
    batch = None if any(b is None for b in batch_dims) else math.prod(batch_dims)
    fields = {"m": m, "n": n, "k": k, "batch": batch}
    return Problem("matmul", fields, (src, wei, dst), len(src), name)


def _decode_dims_list(driver: str, text: str) -> Problem:
    body, name = _split_name(text)
    tensors = tuple(_parse_dims(part, text) for part in body.split(":") if part != "")
    if not tensors:
        raise ProblemError(f"empty descriptor {text!r}")
    return Problem(driver, {}, tensors, len(tensors[0]), name)


def _decode_named(driver: str, text: str) -> Problem:
    """bnorm / gnorm / lrn / resampling / rnn descriptors (``mb2ic16ih7iw7`` ...)."""
    v, name = _generic_tokens(text)
    if driver == "rnn":
        fields = {k: _ival(v, k) for k in ("mb",)}
        t, mb, slc = _ival(v, "t", 1), _ival(v, "mb", 2), _ival(v, "slc", _ival(v, "sic"))
        tensors = ((t, mb, slc),) if slc else ()
        return Problem(driver, fields, tensors, 3 if tensors else None, name)
    mb, ic = _ival(v, "mb", 2), _ival(v, "ic")
    if not ic:
        raise ProblemError(f"{text!r} needs ic")
    sp = {a: _ival(v, "i" + a) for a in SPATIAL}
    if sp["d"] and not sp["h"]:
        sp["h"] = sp["w"] = sp["d"]
    if sp["h"] and not sp["w"]:
        sp["w"] = sp["h"]
    spatial = tuple(sp[a] for a in SPATIAL if sp[a])
    fields = {"mb": mb, "ic": ic, "id": sp["d"], "ih": sp["h"], "iw": sp["w"]}
    src = (mb, ic, *spatial)
    tensors: tuple[tuple[int | None, ...], ...] = (src,)
    if driver == "gnorm":
        fields["g"] = _ival(v, "g", 1)
    if driver == "resampling":
        out = {a: _ival(v, "o" + a) for a in SPATIAL}
        if out["d"] and not out["h"]:
            out["h"] = out["w"] = out["d"]
        if out["h"] and not out["w"]:
            out["w"] = out["h"]
        fields.update({"od": out["d"], "oh": out["h"], "ow": out["w"], "oc": ic})
        tensors = (src, (mb, ic, *(out[a] for a in SPATIAL if out[a])))
    return Problem(driver, fields, tensors, 2 + len(spatial), name)


@lru_cache(maxsize=16384)
def decode_problem(driver: str | None, text: str) -> Problem:
    """Decode a descriptor for a benchdnn driver; raises :class:`ProblemError`."""
    text = (text or "").strip()
    if not text:
        raise ProblemError("empty descriptor")
    driver = driver or ""
    if driver in CONV_DRIVERS:
        return _decode_conv(driver, text)
    if driver == "pool":
        return _decode_pool(text)
    if driver == "ip":
        return _decode_ip(text)
    if driver == "matmul":
        return _decode_matmul(text)
    if driver in NAMED_DRIVERS or not (text[0].isdigit() or text[0] in "*?"):
        return _decode_named(driver, text)
    return _decode_dims_list(driver, text)


# -- encoding ---------------------------------------------------------------------------
def _infer_ndims(fields: Mapping[str, int | None]) -> int:
    def nondefault(a: str) -> bool:
        return any(
            fields.get(key + a) not in (None, dv)
            for key, dv in (("i", 1), ("o", 1), ("k", 1), ("s", 1), ("p", 0), ("d", 0))
        )
    if nondefault("d"):
        return 5
    if nondefault("h"):
        return 4
    return 3


def _spatial_text(fields: Mapping[str, int | None], a: str, keys: tuple[str, ...]) -> str:
    return "".join(f"{key}{a}{int(fields[key + a] or 0)}" for key in keys)


def encode_problem(driver: str, fields: Mapping[str, int | None], ndims: int | None = None) -> str:
    """The canonical descriptor (oneDNN's verbose spelling) for conv, deconv, pool, ip, matmul."""
    if driver in CONV_DRIVERS or driver == "pool":
        nd = ndims or _infer_ndims(fields)
        keys = ("i", "o", "k", "s", "d", "p")
        parts = [_spatial_text(fields, a, keys) for a in SPATIAL[5 - nd :]]
        if driver == "pool":
            head = f"mb{fields['mb']}ic{fields['ic']}"
        else:
            g = int(fields.get("g") or 1)
            head = (f"g{g}" if g != 1 else "") + f"mb{fields['mb']}_ic{fields['ic']}oc{fields['oc']}"
        return "_".join([head, *parts])
    if driver == "ip":
        sp = "".join(f"i{a}{fields['i' + a]}" for a in SPATIAL if fields.get("i" + a))
        return f"mb{fields['mb']}ic{fields['ic']}{sp}oc{fields['oc']}"
    if driver == "matmul":
        m, n, k = fields["m"], fields["n"], fields["k"]
        batch = int(fields.get("batch") or 1)
        b = f"{batch}x" if batch != 1 else ""

        def d(x: int | None) -> str:
            return "*" if x is None else str(x)

        return f"{b}{d(m)}x{d(k)}:{b}{d(k)}x{d(n)}"
    raise ValueError(f"no canonical encoding for driver {driver!r}")


# -- operation counts -------------------------------------------------------------------
@lru_cache(maxsize=65536)
def _taps_in_bounds(o: int, i: int, k: int, s: int, p: int, d: int) -> int:
    """How many (output position, kernel tap) pairs read inside the input along one dim."""
    total = 0
    step = d + 1
    for oo in range(o):
        base = oo * s - p
        lo = (-base + step - 1) // step if base < 0 else 0
        hi = min(k, (i - 1 - base) // step + 1) if i - 1 - base >= 0 else 0
        total += max(0, hi - lo)
    return total


def conv_flops(problem: Problem) -> float | None:
    """benchdnn's op count: 2 * MACs, kernel taps that fall in padding excluded."""
    f = problem.fields
    if problem.driver not in CONV_DRIVERS:
        return None
    sp = 1
    for a in SPATIAL:
        if problem.driver == "deconv":  # the equivalent forward conv maps output -> input
            o, i = f["i" + a], f["o" + a]
        else:
            o, i = f["o" + a], f["i" + a]
        sp *= _taps_in_bounds(int(o), int(i), int(f["k" + a]), int(f["s" + a]), int(f["p" + a]), int(f["d" + a]))
    return 2.0 * f["mb"] * f["oc"] * f["ic"] / f["g"] * sp


def conv_flops_dense(problem: Problem) -> float | None:
    """2 * MACs over the full kernel window (``torch.utils.flop_counter``'s convention)."""
    f = problem.fields
    if problem.driver not in CONV_DRIVERS:
        return None
    window = math.prod(int(f["k" + a]) for a in SPATIAL)
    pos = "i" if problem.driver == "deconv" else "o"
    positions = math.prod(int(f[pos + a]) for a in SPATIAL)
    return 2.0 * f["mb"] * f["oc"] * f["ic"] / f["g"] * window * positions

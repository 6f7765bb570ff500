"""Primitive attributes and auxiliary fields, and their benchdnn spelling.

Attributes are printed two ways:

* oneDNN >= 2.x: space-separated ``attr-<name>:<value>`` items, e.g.
  ``attr-scratchpad:user attr-post-ops:eltwise_relu+sum:1``;
* DNNL 1.x: ``;``-terminated items, e.g. ``oscale:0;post_ops:'sum;eltwise_relu:0:0;';``.

Post-ops become benchdnn's ``--attr-post-ops`` syntax (``sum+relu``): eltwise kinds lose
their ``eltwise_`` prefix, binary kinds their ``binary_`` prefix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

from ..vocabulary import CONV_DRIVERS

_NEW_ITEM = re.compile(r"attr-([a-z_-]+):(\S*)")
_OLD_POST_OPS = re.compile(r"post_ops:'([^']*)'")
_SPLIT_POST_OPS = re.compile(r"\+(?=[a-z])")


@dataclass(frozen=True)
class Attributes:
    """What the attribute field says, in benchdnn's terms where benchdnn has one."""

    post_ops: str | None = None                     # benchdnn syntax, e.g. "sum+relu"
    items: tuple[tuple[str, str], ...] = field(default_factory=tuple)  # (name, value) as printed

    def get(self, name: str) -> str | None:
        for key, value in self.items:
            if key == name:
                return value
        return None


def _post_op_to_benchdnn(entry: str) -> str:
    entry = entry.strip()
    if entry.startswith("eltwise_"):
        return entry[len("eltwise_"):]
    if entry.startswith("binary_"):
        return entry[len("binary_"):]
    return entry


def post_ops_to_benchdnn(entries: list[str]) -> str | None:
    out = [_post_op_to_benchdnn(e) for e in entries if e.strip()]
    return "+".join(out) if out else None


@lru_cache(maxsize=4096)
def parse_attrs(text: str) -> Attributes:
    """Parse an attribute field of any dialect (empty -> no attributes)."""
    text = (text or "").strip()
    if not text:
        return Attributes()
    items: list[tuple[str, str]] = []
    post: str | None = None
    if "attr-" in text:
        for m in _NEW_ITEM.finditer(text):
            name, value = m.group(1), m.group(2)
            items.append((name, value))
            if name == "post-ops":
                post = post_ops_to_benchdnn(_SPLIT_POST_OPS.split(value))
        return Attributes(post, tuple(items))
    m = _OLD_POST_OPS.search(text)
    if m:
        post = post_ops_to_benchdnn(m.group(1).split(";"))
        items.append(("post-ops", m.group(1)))
        text = text[: m.start()] + text[m.end():]
    for item in text.split(";"):
        item = item.strip()
        if not item:
            continue
        name, _, value = item.partition(":")
        if name == "scratchpad_mode":
            name = "scratchpad"
        items.append((name, value))
    return Attributes(post, tuple(items))


@lru_cache(maxsize=4096)
def parse_aux(text: str) -> dict[str, str]:
    """``alg:eltwise_relu alpha:0 beta:0`` -> {"alg": "eltwise_relu", "alpha": "0", ...}."""
    out: dict[str, str] = {}
    for tok in (text or "").split():
        name, _, value = tok.partition(":")
        out[name] = value
    return out


# benchdnn's --alg spelling per driver (the library's algorithm names are accepted by
# most drivers too; these are the documented short names).
_POOL_ALG = {"pooling_max": "max", "pooling_avg_include_padding": "avg_p",
             "pooling_avg_exclude_padding": "avg_np", "pooling_avg": "avg_np"}
_RNN_ALG = {"vanilla_rnn": "VANILLA_RNN", "vanilla_lstm": "VANILLA_LSTM", "vanilla_gru": "VANILLA_GRU",
            "lbr_gru": "LBR_GRU", "vanilla_augru": "VANILLA_AUGRU", "lbr_augru": "LBR_AUGRU"}


def benchdnn_alg(driver: str | None, alg: str | None) -> str | None:
    """The value of benchdnn's ``--alg`` for a library algorithm name."""
    if not alg:
        return None
    if driver in CONV_DRIVERS:
        base = alg.split("_", 1)[1] if "_" in alg else alg
        return {"direct": "direct", "winograd": "wino", "auto": "auto"}.get(base, base)
    if driver == "pool":
        return _POOL_ALG.get(alg, alg)
    if driver == "eltwise":
        return alg[len("eltwise_"):] if alg.startswith("eltwise_") else alg
    if driver == "binary":
        return alg[len("binary_"):] if alg.startswith("binary_") else alg
    if driver == "reduction":
        return alg[len("reduction_"):] if alg.startswith("reduction_") else alg
    if driver == "resampling":
        return alg[len("resampling_"):] if alg.startswith("resampling_") else alg
    if driver == "softmax":
        return {"softmax_accurate": "SOFTMAX", "softmax_log": "LOGSOFTMAX"}.get(alg, alg)
    if driver == "lrn":
        return {"lrn_across_channels": "ACROSS", "lrn_within_channel": "WITHIN"}.get(alg, alg)
    if driver == "rnn":
        return _RNN_ALG.get(alg, alg)
    return alg

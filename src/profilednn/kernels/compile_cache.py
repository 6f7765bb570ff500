"""``torch.compile``'s caches keyed on this version of the kernels' custom ops.

AOTAutograd's on-disk cache (``/tmp/torchinductor_$USER``) keys a graph on the names of the
custom ops in it, not on their Python autograd formulas or fake implementations, which it
traces into the compiled backward. After an upgrade of ProfileDNN, a warm cache could serve a
compiled backward built from the previous version's formulas (seen while developing: a changed
max-pool backward kept its old compiled graph until the cache was deleted). Inductor offers one
knob for this, ``torch.compiler.config.cache_key_tag``, part of every graph's key: this module
adds a digest of the op sources to it, so changed formulas are a cache miss, once.

The tag is set when a model takes one of these modules (``KeyedOnKernels``), never on import:
the profiler loads none of this, so it leaves a profiled program's cache keys alone.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any

import torch

_HERE = Path(__file__).resolve().parent
# The modules that define ``profilednn::*`` custom ops and their autograd formulas / fake impls.
OP_SOURCES: tuple[str, ...] = ("aten_pool.py", "batch_norm.py", "dropout.py", "pointwise_conv.py")
TAG_PREFIX = "profilednn-kernels-"


def sources_digest(directory: Path, names: tuple[str, ...]) -> str:
    """16 hex digits of SHA-256 over each named file's name and bytes, in the order given."""
    sha = hashlib.sha256()
    for name in names:
        sha.update(name.encode() + b"\0" + (directory / name).read_bytes() + b"\0")
    return sha.hexdigest()[:16]


@functools.cache
def kernels_digest() -> str:
    """The digest of this installation's op sources (read once per process)."""
    return sources_digest(_HERE, OP_SOURCES)


def with_kernels_tag(current: str, digest: str) -> str:
    """``current`` (a user's own ``TORCH_COMPILE_CACHE_KEY_TAG`` parts kept, in order) with
    this package's part, ``profilednn-kernels-<digest>``, as the last ``+``-separated part."""
    kept = [part for part in current.split("+") if part and not part.startswith(TAG_PREFIX)]
    return "+".join([*kept, TAG_PREFIX + digest])


def tag_compile_cache() -> str:
    """Put this version's kernels digest into ``torch.compiler.config.cache_key_tag`` (once; a
    tag the user set stays in it); the tag now in force. Call it before compiling code that
    uses the ops directly (``batch_norm_act``, ``fused_dropout``); the modules call it."""
    config = torch.compiler.config
    tag = with_kernels_tag(config.cache_key_tag, kernels_digest())
    if config.cache_key_tag != tag:
        config.cache_key_tag = tag
    return tag


class KeyedOnKernels:
    """Mixin for the modules whose forward calls ``profilednn::*`` ops: creating one (its
    constructor, ``from_*``, a copy or an unpickle all go through ``__new__``) tags the
    compile caches with this version's kernels."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:  # noqa: ARG004 - the constructor's arguments
        tag_compile_cache()
        return super().__new__(cls)


__all__ = ["KeyedOnKernels", "OP_SOURCES", "kernels_digest", "sources_digest", "tag_compile_cache",
           "with_kernels_tag"]

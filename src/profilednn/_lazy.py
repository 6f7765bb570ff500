"""Lazy package exports (PEP 562): a package names its public objects and the module each
lives in, and that module is imported only when the name is first used, so importing the
package (or the CLI) does not pull in torch, matplotlib or torch.distributed."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(package: str, table: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``table`` maps each exported name to its
    module (absolute, or relative to ``package`` when it starts with a dot)."""

    def __getattr__(name: str) -> Any:
        if name in table:
            return getattr(importlib.import_module(table[name], package), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


__all__ = ["lazy_getattr"]

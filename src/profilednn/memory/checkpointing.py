"""Activation checkpointing policies: keep fewer activations, recompute them in backward.

A policy names which parts of a model run under ``torch.utils.checkpoint.checkpoint``
(``use_reentrant=False``); only the inputs of a checkpointed part are saved, and its
forward runs again during backward.

- ``none``: nothing changes.
- ``every:K``: every ``nn.Sequential`` that is not inside another one is cut into runs of
  ``K`` consecutive children, each run one checkpointed segment (the last may be shorter;
  a segment never starts with an in-place module, whose write would change the saved
  input of the segment, so such a boundary moves one child later).
  ``small_cnn``'s ``features``, ResNet's ``layer1..4`` (K bottleneck blocks per segment),
  an MLP's layers.
- ``types:Conv2d,BatchNorm2d``: each module of the named classes is checkpointed alone
  (selective: the layers whose saved tensors are large and cheap to recompute). In-place
  modules are left as they are: checkpointed alone, one would overwrite its own saved input.

Batch norm recomputed in backward updates its running statistics a second time; the
gradients are exact, the running statistics drift slightly. Dropout's randomness is
replayed (``preserve_rng_state``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..errors import InputError

POLICY_HELP = "none, every:K (segments of K children of each outer Sequential), types:Name1,Name2"


class Checkpointed(nn.Module):
    """Runs ``inner`` under non-reentrant activation checkpointing."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return self.inner(*args, **kwargs)
        return checkpoint(self.inner, *args, use_reentrant=False, **kwargs)


def parse_policy(policy: str) -> tuple[str, Any]:
    """``"every:2"`` -> ("every", 2); ``"types:Conv2d"`` -> ("types", {"Conv2d"}); InputError otherwise."""
    text = (policy or "none").strip()
    kind, _, arg = text.partition(":")
    if kind == "none" and not arg:
        return "none", None
    if kind == "every":
        try:
            k = int(arg)
        except ValueError:
            k = 0
        if k < 1:
            raise InputError(f"checkpoint policy {policy!r}: every:K needs an integer K >= 1")
        return "every", k
    if kind == "types":
        names = {n.strip() for n in arg.split(",") if n.strip()}
        if not names:
            raise InputError(f"checkpoint policy {policy!r}: types: needs class names, e.g. types:Conv2d")
        return "types", names
    raise InputError(f"unknown checkpoint policy {policy!r}; use {POLICY_HELP}")


def _outer_sequentials(model: nn.Module) -> list[nn.Sequential]:
    found: list[nn.Sequential] = []

    def visit(module: nn.Module) -> None:
        if isinstance(module, nn.Sequential):
            found.append(module)
            return
        for child in module.children():
            visit(child)

    visit(model)
    return found


def _segments(children: list[nn.Module], k: int) -> list[tuple[int, int]]:
    """Runs of ``k`` children; a boundary never falls before an in-place module (a ReLU with
    ``inplace=True`` would modify the segment's saved input), it moves one child later."""
    bounds = [0]
    i = k
    while i < len(children):
        while i < len(children) and getattr(children[i], "inplace", False):
            i += 1
        if i < len(children):
            bounds.append(i)
        i += k
    bounds.append(len(children))
    return list(zip(bounds[:-1], bounds[1:]))


def apply_checkpointing(model: nn.Module, policy: str) -> int:
    """Rewrite ``model`` in place for ``policy``; returns how many parts are checkpointed.

    Parameters keep their identity (modules are wrapped, not copied), so an optimizer
    built before still holds the right tensors; parameter names gain ``.inner``.
    """
    kind, arg = parse_policy(policy)
    if kind == "none":
        return 0
    if kind == "every":
        count = 0
        for seq in _outer_sequentials(model):
            children = list(seq._modules.items())
            if not children:
                continue
            groups: list[nn.Module] = []
            for start, end in _segments([m for _, m in children], arg):
                run = [m for _, m in children[start:end]]
                groups.append(Checkpointed(run[0] if len(run) == 1 else nn.Sequential(*run)))
            seq._modules.clear()
            for i, group in enumerate(groups):
                seq.add_module(str(i), group)
            count += len(groups)
        if count == 0:
            raise InputError(f"checkpoint policy {policy!r}: {type(model).__name__} has no nn.Sequential to segment; "
                             "use types:... instead")
        return count
    matched = 0
    present = {type(m).__name__ for m in model.modules()}
    unknown = sorted(arg - present)
    if unknown:
        raise InputError(f"checkpoint policy {policy!r}: the model has no {', '.join(unknown)} "
                         f"(it has {', '.join(sorted(present))})")

    def wrap(parent: nn.Module) -> None:
        nonlocal matched
        for name, child in list(parent._modules.items()):
            if child is None or isinstance(child, Checkpointed):
                continue
            if type(child).__name__ in arg and not getattr(child, "inplace", False):
                parent._modules[name] = Checkpointed(child)
                matched += 1
            else:
                wrap(child)

    wrap(model)
    return matched


__all__ = ["Checkpointed", "POLICY_HELP", "apply_checkpointing", "parse_policy"]

"""The contract between the script injector (``script/inject.py``) and a recipe's injection.

The injector owns the generic machinery of an arm: hooks on every module call, patches,
the discovery of the script's root modules, optimizers, DataLoaders, loss and
DistributedDataParallel models, and the record of what it saw (``ScriptFacts``). A recipe
that can reach a script gives it an ``Injection`` (``Recipe.injection()``, one per arm),
whose hooks the injector calls at each of those moments for the chosen recipes, in the
catalogue's injection order (``recipe_catalogue.INJECTION_ORDER``). An injection changes
the script's objects in place, never its source, and says what it did through
``ScriptProcess.said``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from torch import nn

    from .script_facts import DdpFacts, RootFacts, ScriptFacts


class ScriptProcess(Protocol):
    """What an injection may use of the injector running in the script's process."""

    options: Mapping[str, Any]  # the arm's options (compile_mode, dropout_sites, eager_random, ...)
    facts: "ScriptFacts"
    applied: dict[str, str]  # recipe -> what it did, one line

    def said(self, recipe: str, how: str) -> None:
        """Record what ``recipe`` did (the first line said is kept)."""

    def patch(self, owner: Any, attr: str, new: Any) -> None:
        """Set ``owner.attr = new`` until the injector is removed."""

    def updated_parameters(self) -> set[int]:
        """The ids of the parameters some optimizer updates (in a group with lr != 0)."""

    def observe_site(self, name: str, module: "nn.Module") -> None:
        """Observe dropout module ``module``'s first training call and its backward (the
        random-stream gate's sites; with the option ``dropout_sites``)."""

    def unobserved(self) -> Any:
        """A context in which the optimizers built and the DDP comm hooks registered are not
        the script's (not recorded)."""


class Injection:
    """A recipe's part of an arm: every hook does nothing unless the recipe overrides it."""

    def install(self, process: ScriptProcess) -> None:
        """When the arm starts, before the script runs: patches of one's own."""

    def prepare_root(self, process: ScriptProcess, module: "nn.Module", facts: "RootFacts") -> None:
        """A root module's first call, before any injection changes it."""

    def inject_root(self, process: ScriptProcess, module: "nn.Module", facts: "RootFacts") -> None:
        """A root module's first call: change it in place (in injection order)."""

    def root_args(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """Each call of a root module: its positional arguments, changed or as they are."""
        return args

    def enter_root_call(self) -> Callable[[Any], Any] | None:
        """Each call of a root module: enter what wraps the call; return what to do with
        its output when it returns (exit, then the output to return), or None."""
        return None

    def optimizer_created(self, process: ScriptProcess, optimizer: Any, how: str | None, why: str) -> None:
        """An optimizer the script built (``how``/``why``: what ``fused_optimizer`` would do)."""

    def ddp_arguments(self, process: ScriptProcess, arguments: dict[str, Any], facts: "DdpFacts") -> None:
        """The script builds a ``DistributedDataParallel``: ``arguments`` are what it passed,
        by parameter name (``module`` included); set those to change in place, never one the
        script passed (``facts``: what it passed, the module's gradient bytes)."""

    def ddp_created(self, process: ScriptProcess, model: Any, facts: "DdpFacts") -> None:
        """A ``DistributedDataParallel`` the script built, right after its construction."""

    def focal_loss(self, process: ScriptProcess) -> Callable[..., Any] | None:
        """What torchvision's ``sigmoid_focal_loss`` should call instead of itself, or None."""
        return None

    def attention(self, process: ScriptProcess, compiling: bool, call: "AttentionCall") -> Any:
        """A call of ``F.scaled_dot_product_attention``: its result computed otherwise, or
        ``NotImplemented`` to leave it to the original."""
        return NotImplemented


@dataclass
class AttentionCall:
    """The arguments of one ``F.scaled_dot_product_attention`` call."""

    query: Any
    key: Any
    value: Any
    attn_mask: Any = None
    dropout_p: float = 0.0
    is_causal: bool = False
    scale: Any = None
    enable_gqa: bool = False


__all__ = ["AttentionCall", "Injection", "ScriptProcess"]

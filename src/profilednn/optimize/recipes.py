"""The recipe contract and registry.

A recipe is one change to a training setup that may make a step faster. Each says:

- ``check(setup, ctx)``: whether it applies (model, ISA, dtype, what is already done);
  ``None`` when it does, else the reason it does not, in one line;
- ``apply(setup, ctx)``: the change, made in place on a fresh clone; returns a one-line
  description of what was changed;
- ``tolerance``: how far its loss trajectory and gradients may drift from the stock
  setup's and still count as the same training (stated in the report);
- ``fresh_process``: whether it acts only at process start (LD_PRELOAD, OpenMP
  environment), so it must be measured in child processes.

Recipes register themselves under a name with ``@register``; names match the advice rules
they act on (``fused_loss``, ``fused_optimizer``, ``channels_last``, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import InputError

if TYPE_CHECKING:
    from ..topology import CpuTopology
    from .setup import TrainSetup


@dataclass(frozen=True)
class Tolerance:
    """Numerics bounds against the stock setup over the same seeded steps.

    ``loss_rtol``: largest relative difference of any step's loss; ``grad_rtol``: relative
    L2 difference ||G_b - G_a|| / ||G_a|| of the first step's gradients of all optimized
    parameters together.
    """

    loss_rtol: float = 1e-3
    grad_rtol: float = 1e-2

    def describe(self) -> str:
        return f"loss within {self.loss_rtol:g} relative, gradients within {self.grad_rtol:g} relative L2 (all together)"


FP32_TOLERANCE = Tolerance()
# BF16 keeps 8 bits of mantissa: ~0.4 % per rounding; a few steps of a deep net drift more.
BF16_TOLERANCE = Tolerance(loss_rtol=5e-2, grad_rtol=2.5e-1)


@dataclass
class Context:
    """What recipes may consult: the CPU, the caller's options, the data loader if any."""

    topology: "CpuTopology"
    options: dict[str, Any] = field(default_factory=dict)


class Recipe:
    """Base class: subclasses set the class attributes and implement check/apply."""

    name: ClassVar[str] = ""
    family: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    advice_rules: ClassVar[tuple[str, ...]] = ()
    tolerance: ClassVar[Tolerance] = FP32_TOLERANCE
    fresh_process: ClassVar[bool] = False
    # A reduced number format the recipe computes in ("bf16"): judged by the precision
    # gate (does it train as well?, ``precision_gate.py``), not by the fp32 gate.
    precision: ClassVar[str | None] = None

    def check(self, setup: "TrainSetup", ctx: Context) -> str | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def apply(self, setup: "TrainSetup", ctx: Context) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<recipe {self.name}>"


RECIPES: dict[str, Recipe] = {}


def register(cls: type[Recipe]) -> type[Recipe]:
    """Class decorator: add one instance of ``cls`` to ``RECIPES`` under ``cls.name``."""
    if not cls.name or cls.name in RECIPES:
        raise ValueError(f"recipe name missing or taken: {cls.name!r}")
    RECIPES[cls.name] = cls()
    return cls


def load_recipes() -> dict[str, Recipe]:
    """Every built-in recipe, in the order ``optimize`` tries them (cheap, safe, in-process
    changes first; torch.compile after them; process-level settings last)."""
    from . import compile as _compile  # noqa: F401  (each module registers its recipes)
    from . import data as _data  # noqa: F401
    from . import frozen as _frozen  # noqa: F401
    from . import layout as _layout  # noqa: F401
    from . import loss as _loss  # noqa: F401
    from . import optimizers as _optimizers  # noqa: F401
    from . import precision as _precision  # noqa: F401
    from . import process as _process  # noqa: F401

    order = (
        "frozen_weight_grads", "frozen_batchnorm", "fused_loss", "fused_optimizer",
        "channels_last", "dtype_policy", "torch_compile", "dataloader_workers", "threads",
        "allocator",
    )
    ordered = {name: RECIPES[name] for name in order if name in RECIPES}
    ordered.update({k: v for k, v in RECIPES.items() if k not in ordered})
    return ordered


def select_recipes(names: "list[str | Recipe] | str | None") -> list[Recipe]:
    """Recipes by name (a list, or ``"a,b,c"``) or as ``Recipe`` instances; all built-in
    ones for None. Named built-ins run in the registry's order whatever order they were
    given in (the order matters: torch.compile last, process settings after it); extra
    ``Recipe`` instances run after them, in the order given."""
    available = load_recipes()
    if names is None:
        return list(available.values())
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    if not names:
        raise InputError(f"no recipe named; choose from: {', '.join(available)}")
    wanted = [n for n in names if isinstance(n, str)]
    unknown = [n for n in wanted if n not in available]
    if unknown:
        raise InputError(f"unknown recipe(s) {', '.join(unknown)}; choose from: {', '.join(available)}")
    extra = [r for r in names if not isinstance(r, str)]
    bad = [r for r in extra if not isinstance(r, Recipe)]
    if bad:
        raise InputError(f"recipes must be names or Recipe instances, got {bad[0]!r}")
    return [r for n, r in available.items() if n in wanted] + list(dict.fromkeys(extra))


__all__ = [
    "BF16_TOLERANCE",
    "Context",
    "FP32_TOLERANCE",
    "RECIPES",
    "Recipe",
    "Tolerance",
    "load_recipes",
    "register",
    "select_recipes",
]

"""The recipe contract: what a recipe is (``Recipe``), how far it may drift
(``Tolerance``), what it may consult (``Context``), and the registry it joins
(``RECIPES``, ``@register``).

Recipe modules import this module only; ``recipes.py`` imports every recipe module
and orders them, so the registry is full as soon as ``profilednn.optimization`` is imported.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar

from ..topology import DTYPE_ISA, dtype_speed, isa_removed_by_cap, onednn_isa_cap

if TYPE_CHECKING:
    from ..topology import CpuTopology, DtypeSpeed
    from ..train_step import TrainStep


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
        if self.grad_rtol == float("inf"):  # losses alone decide (a script's arms return no gradients)
            return f"loss within {self.loss_rtol:g} relative"
        return (f"loss within {self.loss_rtol:g} relative, gradients within {self.grad_rtol:g} relative L2 "
                "(all together)")


FP32_TOLERANCE = Tolerance()
# BF16 keeps 8 bits of mantissa: ~0.4 % per rounding; a few steps of a deep net drift more.
BF16_TOLERANCE = Tolerance(loss_rtol=5e-2, grad_rtol=2.5e-1)


@dataclass
class Context:
    """What recipes may consult: the CPU, the caller's options, and this machine's measured
    GEMM peaks per dtype (GFLOP/s; None where nothing needed them)."""

    topology: "CpuTopology"
    options: dict[str, Any] = field(default_factory=dict)
    gemm_peaks: Mapping[str, float] | None = None

    def dtype_speed(self, dtype: str) -> "DtypeSpeed":
        """Whether ``dtype`` pays on this CPU, and why (``profilednn.topology.dtype_speed``);
        when it does not because ``ONEDNN_MAX_CPU_ISA`` took the CPU's own ISA for it away,
        the reason says so (the user's setting, not the silicon, said no)."""
        speed = dtype_speed(dtype, self.topology.isa, self.gemm_peaks)
        if speed.faster:
            return speed
        removed = sorted(isa_removed_by_cap() & set(DTYPE_ISA.get(dtype, ())))
        if not removed:
            return speed
        variable, level = onednn_isa_cap() or ("ONEDNN_MAX_CPU_ISA", "?")
        return replace(speed, reason=f"{speed.reason} ({variable}={level} keeps oneDNN from this CPU's "
                                     f"{', '.join(removed)}; unset it to use them)")


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
    # False for a recipe that changes no arithmetic (threads, affinity, allocator, where the
    # batches come from): judged by the environment gate (same losses as the arm it
    # replaces, bit for bit or within that arm's own noise), never by gradient tolerances.
    changes_arithmetic: ClassVar[bool] = True
    # True for a recipe that changes which random numbers are drawn (dropout masks from
    # another generator): judged with dropout off as usual and, with dropout on, by the
    # random-stream gate (``stream_gate.py``: every dropout site, and the trajectory against
    # the arm's spread between dropout seeds).
    random_stream: ClassVar[bool] = False
    # True for a recipe whose generated code draws random numbers (dropout masks) from its
    # own generator, not eager PyTorch's (``torch.compile``: Inductor's). A script cannot turn
    # its dropout off, so where its trajectory fails the gate, the script path judges it again
    # on a run with eager's stream (``torch._inductor.config.fallback_random``): the same
    # masks as the arm's, so only the arithmetic is compared.
    compiled_random: ClassVar[bool] = False

    def check(self, setup: "TrainStep", ctx: Context) -> str | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def apply(self, setup: "TrainStep", ctx: Context) -> str:  # pragma: no cover - abstract
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


__all__ = ["BF16_TOLERANCE", "Context", "FP32_TOLERANCE", "RECIPES", "Recipe", "Tolerance", "register"]

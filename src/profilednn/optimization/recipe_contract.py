"""The recipe contract: what a recipe is (``Recipe``), how far it may drift
(``Tolerance``), what it may consult (``Context``), and the registry (``RECIPES``).

A built-in recipe is one module (its ``RECIPE``) and one line of ``recipe_catalogue.py``;
``recipes.py`` loads the catalogue's modules into ``RECIPES`` in the catalogue's order.
``@register`` adds a recipe of one's own.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar

from ..recipe_catalogue import GateKind, find
from ..topology import DTYPE_ISA, dtype_speed, isa_removed_by_cap, onednn_isa_cap

if TYPE_CHECKING:
    from ..topology import CpuTopology, DtypeSpeed
    from ..train_step import TrainStep
    from .injection import Injection
    from .script_facts import ScriptFacts


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


@dataclass(frozen=True)
class DigitsArms:
    """How the precision gate's digits task trains a recipe that is no change to a training
    state (a DDP hook acts on the allreduce between ranks): one step of the stock arm, one of
    the recipe's (each on the digits ``TrainStep``, from its next batch), and what they do,
    in a few words for the detail line."""

    stock: Callable[[TrainStep], object]
    recipe: Callable[[TrainStep], object]
    how: str


@dataclass
class LaunchState:
    """The part of a training state a process-level recipe reads and writes: the environment
    the training process is launched with (what ``launch_check``/``launch_environment`` hand
    to the ``check``/``apply`` of a recipe of one's own that implements only those)."""

    env: dict[str, str] = field(default_factory=dict)


class Recipe:
    """Base class: subclasses set the class attributes and implement check/apply; one that
    reaches a script implements ``script_check``, ``code_edit`` and ``injection``; a
    process-level one (``fresh_process``) ``launch_check`` and ``launch_environment``."""

    name: ClassVar[str] = ""
    family: ClassVar[str] = ""
    summary: ClassVar[str] = ""
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

    @property
    def advice_rules(self) -> tuple[str, ...]:
        """The advice rules this recipe acts on: a built-in's catalogue line says them (a
        recipe of one's own may set ``advice_rules`` as a class attribute)."""
        listed = find(self.name)
        return listed.advice_rules if listed is not None else ()

    @property
    def gate_kind(self) -> GateKind:
        """The gate that judges this recipe, as ``gate.judge`` picks it from the attributes above."""
        if not self.changes_arithmetic:
            return "environment"
        if self.precision:
            return "precision"
        return "random_stream" if self.random_stream else "arithmetic"

    def check(self, setup: "TrainStep", ctx: Context) -> str | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def apply(self, setup: "TrainStep", ctx: Context) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def digits_arms(self, ctx: Context, ranks: int) -> DigitsArms | None:
        """The two arms the precision gate's digits task trains, for a recipe that cannot be
        applied to a training state (``ranks``: the job's); None: the task applies the recipe
        (``check``, ``apply``) to a clone of the stock arm and trains both with ``run``."""
        return None

    # -- the user's script (``optimize -- python train.py``) --------------------------------
    def script_check(self, facts: "ScriptFacts", ctx: Context, accepted: Collection[str] = ()) -> str | None:
        """Why this recipe does not apply to a script, from what its stock arm saw (None: it
        does); ``accepted``: the injected recipes accepted so far."""
        return f"{self.name} cannot be injected into a script (no injection is known for it)"

    def code_edit(self, facts: "ScriptFacts") -> str | None:
        """The edit to the script that does by hand what the injection does (None: none)."""
        return None

    def injection(self) -> "Injection | None":
        """A fresh injection of this recipe for one arm of a script (None: not injectable)."""
        return None

    # -- process-level recipes (``fresh_process``) ------------------------------------------
    def launch_check(self, ctx: Context, env: Mapping[str, str]) -> str | None:
        """Why this process-level recipe does not apply to a process launched with ``env``
        (None: it does). By default the recipe's ``check`` on a ``LaunchState``."""
        return self.check(LaunchState(dict(env)), ctx)  # type: ignore[arg-type]  # reads .env only

    def launch_environment(self, ctx: Context, env: Mapping[str, str]) -> tuple[dict[str, str], str]:
        """(the variables this process-level recipe sets on top of ``env``, what it did in one
        line). By default the recipe's ``apply`` on a ``LaunchState``."""
        state = LaunchState(dict(env))
        how = self.apply(state, ctx)  # type: ignore[arg-type]  # writes .env only
        return {k: v for k, v in state.env.items() if env.get(k) != v}, how

    def __repr__(self) -> str:
        return f"<recipe {self.name}>"


class LaunchRecipe(Recipe):
    """A process-level recipe: it acts only when a process starts (the dynamic loader reads
    LD_PRELOAD, OpenMP reads OMP_* once), so it says what to add to the launch environment
    (``launch_check``, ``launch_environment``), and ``check``/``apply`` on a training state
    read and write that state's ``env``."""

    fresh_process = True
    changes_arithmetic = False

    def launch_check(self, ctx: Context, env: Mapping[str, str]) -> str | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def launch_environment(self, ctx: Context, env: Mapping[str, str]) -> tuple[dict[str, str], str]:
        raise NotImplementedError  # pragma: no cover - abstract

    def check(self, setup: "TrainStep", ctx: Context) -> str | None:
        return self.launch_check(ctx, setup.env)

    def apply(self, setup: "TrainStep", ctx: Context) -> str:
        added, how = self.launch_environment(ctx, setup.env)
        setup.env.update(added)
        return how


RECIPES: dict[str, Recipe] = {}


def register(cls: type[Recipe]) -> type[Recipe]:
    """Class decorator for a recipe of one's own: add one instance of ``cls`` to ``RECIPES``
    under ``cls.name`` (``load_recipes`` lists it after the built-in ones)."""
    if not cls.name or cls.name in RECIPES:
        raise ValueError(f"recipe name missing or taken: {cls.name!r}")
    RECIPES[cls.name] = cls()
    return cls


__all__ = ["BF16_TOLERANCE", "Context", "DigitsArms", "FP32_TOLERANCE", "LaunchRecipe", "LaunchState", "RECIPES",
           "Recipe", "Tolerance", "register"]

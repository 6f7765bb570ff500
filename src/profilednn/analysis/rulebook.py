"""The advice rulebook: what a rule returns (``Advice``), how rules register, and the
facts several rules share (the per-step denominator, native BF16).

A rule takes a :class:`~profilednn.analysis.view.RunView` (the Run's tables and facts, which
the ``Analysis`` facade implements), never the facade: rule modules import this module and
``view`` and nothing above them, so the rules, the comparison and the facade form no cycle,
``TYPE_CHECKING`` imports counted. A rule's action ends with the
command that acts on it for the Run at hand (``next_steps``). ``@rule`` names a function
and does not register it: ``rules.py`` lists the rule modules and collects their rules
(``rules_in``), so nothing registers as a side effect of an import.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, replace
from types import ModuleType
from typing import TYPE_CHECKING, Callable

import polars as pl

from ..topology import NATIVE_BF16_FLAGS  # the topology's answer: avx_ne_convert only converts, not native
from .next_steps import next_step

if TYPE_CHECKING:
    from ..hardware.machine import MachineProfile
    from .view import RunView

SEVERITIES = ("high", "medium", "low")


@dataclass(frozen=True)
class Advice:
    """One recommendation: what was seen, what it may gain, what to do."""

    rule: str
    severity: str  # high | medium | low
    evidence: str
    estimated_gain_pct: float  # of the mean step time
    action: str
    recipe: str | None = None  # the optimize recipe that acts on it, where not the rule's usual one

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        del d["recipe"]  # the JSON keys stay the advice's five; the action's next step names the recipe
        d["estimated_gain_pct"] = round(float(self.estimated_gain_pct), 2)
        return d


def severity_for(gain_pct: float) -> str:
    return "high" if gain_pct >= 10.0 else "medium" if gain_pct >= 3.0 else "low"


Rule = Callable[["RunView"], "Advice | None"]
RULE_NAME = "advice_rule"  # the attribute ``@rule`` sets on a rule function


def rule(name: str) -> Callable[[Rule], Rule]:
    """Make ``fn`` the rule ``name`` (the ``rule`` field of its Advice); ``rules_in`` finds it.

    The rule (and the name it is bound to) appends to its action the command that acts on
    it for this Run (``next_steps.next_step``: ``profilednn optimize`` with the Run's own
    workload), so every action leads somewhere the user can go.
    """

    def mark(fn: Rule) -> Rule:
        @functools.wraps(fn)
        def with_next_step(a: "RunView") -> "Advice | None":
            advice = fn(a)
            if advice is None:
                return None
            step = next_step(a, name, advice.action, recipe=advice.recipe)
            return advice if step is None else replace(advice, action=f"{advice.action} {step}")

        setattr(with_next_step, RULE_NAME, name)
        return with_next_step

    return mark


def rules_in(*modules: ModuleType) -> dict[str, Rule]:
    """The rules the ``modules`` define (``@rule`` functions), by name, in module order and
    then in the order each module defines them."""
    found: dict[str, Rule] = {}
    for module in modules:
        for fn in vars(module).values():
            name = getattr(fn, RULE_NAME, None)
            if name is None or getattr(fn, "__module__", None) != module.__name__:
                continue  # not a rule, or one imported from another module
            if name in found:
                raise ValueError(f"two advice rules are named {name!r} ({found[name].__module__} and "
                                 f"{module.__name__}): rename one")
            found[name] = fn
    return found


# ------------------------------------------------------------------------- shared facts
def denominator(a: "RunView") -> tuple[float | None, str]:
    """Mean step time, or oneDNN time per step for a source without steps."""
    if a.step_ms:
        return a.step_ms, "of the step"
    if a.primitives is not None and a.primitives.height:
        total = float(a.primitives["time_ms"].sum()) / a.n_steps
        return (total or None), "of oneDNN time"
    return None, ""


def per_step(df: pl.DataFrame | None, column: str, a: "RunView") -> float:
    if df is None or df.height == 0:
        return 0.0
    return float(df[column].sum() or 0.0) / a.n_steps


def steps_mean(a: "RunView", column: str) -> float | None:
    """The mean of a ``steps`` column over the measured steps; None where it was not recorded."""
    if a.steps is None or column not in a.steps.columns or a.steps[column].drop_nulls().len() == 0:
        return None
    return float(a.steps[column].mean())


def native_bf16(fingerprint: dict) -> bool | None:
    """Whether the CPU computes BF16 natively; ``None`` when the fingerprint does not say.

    An injected CPU (``PROFILEDNN_TOPOLOGY`` / ``PROFILEDNN_CPU_FLAGS``, see
    ``profilednn.topology``) answers instead: "what would you advise on a CPU with AMX?".
    """
    from ..topology import cpu_topology, topology_injection

    if topology_injection():
        return "bf16" in cpu_topology().native_dtypes
    value = fingerprint.get("native_bf16")
    if value is not None:
        return bool(value)
    flags = fingerprint.get("isa_flags")
    if flags:
        return bool(NATIVE_BF16_FLAGS & {str(f).lower() for f in flags})
    return None


def cached_machine_here(a: "RunView") -> tuple["MachineProfile | None", bool]:
    """This machine's cached profile (None when none is cached: advice never measures) and
    whether the Run was captured on this CPU (only then do the profile's figures apply)."""
    from ..hardware.machine import cached_machine
    from ..topology import cpu_topology

    return cached_machine(), a.fingerprint.get("cpu_model") == cpu_topology().model_name


__all__ = ["Advice", "cached_machine_here", "NATIVE_BF16_FLAGS", "RULE_NAME", "Rule", "SEVERITIES", "denominator", "native_bf16",
           "per_step", "rule", "rules_in", "severity_for", "steps_mean"]

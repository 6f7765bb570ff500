"""Advice actions that name only APIs that exist, for the classes the user really has.

Capture records each optimizer class that stepped (``manifest["optimizers"]``: class,
module, whether its constructor takes ``fused``/``foreach``, their values). An action's
code is built from that record and checked against the installed packages: a callable
is named only when it imports and takes the keyword the snippet passes. Code inside an
action is set in backticks, so :func:`snippet_callables` can find (and a test import)
every callable an action names.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable

_CALL = re.compile(r"\b([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)\(")
_CODE = re.compile(r"`([^`]+)`")
_PROFILED_STEP = re.compile(r"Optimizer\.step#(\w+)\.step")
_FUSED_LAMB = "profilednn.kernels.FusedLAMB"


@dataclass(frozen=True)
class OptimizerFix:
    """What to write instead of the user's optimizer, and why it is faster."""

    current: str        # the class the user has, e.g. ``timm.optim.lamb.Lamb``
    snippet: str | None  # code naming importable callables, or None: no drop-in exists
    why: str

    def action(self) -> str:
        if self.snippet is None:
            return self.why
        return f"Replace {self.current} with `{self.snippet}`: {self.why}"


def resolve(dotted: str) -> Any:
    """Import ``pkg.mod.Attr.attr``; raise ``ImportError``/``AttributeError`` when absent."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    return importlib.import_module(dotted)


def takes_keyword(dotted: str, keyword: str) -> bool:
    """True when ``dotted`` imports and its signature accepts ``keyword``."""
    try:
        obj = resolve(dotted)
        params = inspect.signature(obj).parameters
    except (ImportError, AttributeError, TypeError, ValueError):
        return False
    return keyword in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def snippet_callables(action: str) -> list[str]:
    """Module-qualified callables (``torch.optim.AdamW``) named in an action's backticked code.

    A call on a user's object (``out.float()``, ``optimizer.step``) names no API to import:
    only names whose first part is an installed top-level module count.
    """
    names = [m.group(1) for code in _CODE.findall(action) for m in _CALL.finditer(code)]
    return [n for n in names if _is_module(n.split(".", 1)[0])]


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _torch_optimizer(name: str, keyword: str) -> str | None:
    dotted = f"torch.optim.{name}"
    return dotted if takes_keyword(dotted, keyword) else None


def optimizer_fix(record: dict[str, Any] | None, profiled_op: str | None = None) -> OptimizerFix | None:
    """The fix for one optimizer class; ``None`` when it already runs fused.

    ``record`` is one entry of ``manifest["optimizers"]``; without it (a Run from an
    older capture) the class name comes from the profiler's ``Optimizer.step#Name.step``.
    """
    if record is None and profiled_op is not None and (m := _PROFILED_STEP.search(profiled_op)):
        name = m.group(1)
        module = "torch.optim" if _torch_optimizer(name, "foreach") else ""
        record = {"class": name, "module": module}
    if record is None:
        return OptimizerFix("the optimizer", None, _GENERIC)
    name, module = str(record.get("class", "")), str(record.get("module", ""))
    current = f"{module}.{name}" if module else name
    if record.get("fused"):
        return None
    is_torch = module == "torch.optim" or module.startswith("torch.optim.")
    if is_torch and (dotted := _torch_optimizer(name, "fused")):
        return OptimizerFix(current, f"{dotted}(params, ..., fused=True)",
                            "one fused kernel updates every parameter (CPU kernels exist for Adam, "
                            "AdamW, SGD and Adagrad)")
    if "lamb" in name.lower() and takes_keyword(_FUSED_LAMB, "weight_decay"):
        return OptimizerFix(current, f"{_FUSED_LAMB}(params, lr=..., betas=..., eps=..., weight_decay=...)",
                            "ProfileDNN's fused LAMB makes about 7 passes over memory per step instead "
                            "of about 30 (seed 000 measured a 5.5x faster update); check that your "
                            "LAMB variant's options (trust clipping, bias correction) match")
    if not is_torch and (dotted := _torch_optimizer(name, "fused")):
        return OptimizerFix(current, f"{dotted}(params, ..., fused=True)",
                            f"torch's fused {name} (one kernel over all parameters) when it implements "
                            f"the same update as {current}")
    if is_torch and record.get("foreach") is not True and (dotted := _torch_optimizer(name, "foreach")):
        return OptimizerFix(current, f"{dotted}(params, ..., foreach=True)",
                            "multi-tensor kernels update all parameters in a few calls")
    if record.get("accepts_foreach") and record.get("foreach") is not True and module \
            and takes_keyword(current, "foreach"):
        return OptimizerFix(current, f"{current}(params, ..., foreach=True)",
                            "multi-tensor kernels update all parameters in a few calls")
    return OptimizerFix(current, None, f"{current} has no fused drop-in here: {_GENERIC}")


_GENERIC = ("write its update with multi-tensor torch._foreach_* ops, or compile the step "
            "(`torch.compile(optimizer.step)`), so one kernel covers many parameters")


def profiled_step_op(profiled_ops: Iterable[str]) -> str | None:
    """The profiler's ``Optimizer.step#Name.step`` among ``profiled_ops`` (which class
    stepped, for a Run without ``manifest["optimizers"]``), or None."""
    return next((str(o) for o in profiled_ops if _PROFILED_STEP.search(str(o))), None)


def optimizer_fixes(records: Iterable[dict[str, Any]] | None,
                    profiled_ops: Iterable[str] = ()) -> list[OptimizerFix]:
    """Fixes for every optimizer a Run recorded (or, without records, the profiled one)."""
    recs = list(records or [])
    if recs:
        return [f for f in (optimizer_fix(r) for r in recs) if f is not None]
    fix = optimizer_fix(None, profiled_step_op(profiled_ops))
    return [fix] if fix is not None else []


def check_action(action: str, importer: Callable[[str], Any] = resolve) -> list[str]:
    """Callables named in ``action``'s code that do not import (empty: all exist)."""
    bad = []
    for dotted in snippet_callables(action):
        try:
            importer(dotted)
        except (ImportError, AttributeError):
            bad.append(dotted)
    return bad

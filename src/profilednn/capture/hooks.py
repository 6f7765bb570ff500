"""Global instrumentation: where each module, phase and step begins and ends.

Works on any model without edits: module forward hooks are registered globally
(``torch.nn.modules.module``), backward boundaries come from hooks on each leaf module's
gradient node (robust to in-place ops such as ``ReLU(inplace=True)``, unlike module
backward hooks), ``torch.autograd.backward`` is wrapped to mark the backward phase, and
the global optimizer step hooks mark optimizer time and step ends.

Every boundary becomes a marker line in the verbose stream (see ``stream.write_marker``),
so primitives are attributed by their exact position in the log.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, Callable

import torch
import torch.optim.optimizer as _optim_mod
from torch import nn

from .stream import write_marker

_LOSS_BASES: tuple[type, ...] = (nn.modules.loss._Loss,)


def _clean(name: str) -> str:
    return name.replace(",", ";").replace("\n", " ")


def is_loss_module(module: nn.Module) -> bool:
    """Loss modules (``nn.CrossEntropyLoss``, a user's ``FocalLoss``) form the loss phase."""
    return isinstance(module, _LOSS_BASES) or type(module).__name__.endswith("Loss")


class ModuleNames:
    """Dotted names for every module of every root model seen in a forward call."""

    def __init__(self) -> None:
        self._names: "weakref.WeakKeyDictionary[nn.Module, str]" = weakref.WeakKeyDictionary()
        self.info: dict[str, dict[str, Any]] = {}
        self._roots = 0

    def register_root(self, root: nn.Module, name: str | None = None) -> None:
        if root in self._names:
            return
        if name is None:
            name = type(root).__name__ if self._roots == 0 else f"{type(root).__name__}{self._roots}"
        self._roots += 1
        prefix = "" if self._roots == 1 else f"{name}."
        for sub_name, sub in root.named_modules():
            if sub in self._names:
                continue
            full = _clean(name if sub_name == "" else prefix + sub_name)
            self._names[sub] = full
            own = list(sub.parameters(recurse=False))
            self.info[full] = {
                "module_type": type(sub).__name__,
                "leaf": len(list(sub.children())) == 0,
                "params": int(sum(p.numel() for p in own)),
                "trainable_params": int(sum(p.numel() for p in own if p.requires_grad)),
                "is_root": sub_name == "",
            }

    def name(self, module: nn.Module) -> str | None:
        return self._names.get(module)


def _grad_nodes(obj: Any, found: dict[int, Any]) -> None:
    """Collect the distinct autograd nodes that produced the tensors in ``obj``."""
    if isinstance(obj, torch.Tensor):
        fn = obj.grad_fn
        if fn is not None:
            found.setdefault(id(fn), fn)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            _grad_nodes(item, found)
    elif isinstance(obj, dict):
        for item in obj.values():
            _grad_nodes(item, found)


class Instrumentation:
    """Installs and removes the global hooks; emits markers only while ``active``."""

    def __init__(
        self,
        on_step_end: Callable[[], None] | None = None,
        on_backward: Callable[[Any], None] | None = None,
    ) -> None:
        self.names = ModuleNames()
        self.on_backward = on_backward
        self.active = False
        self.on_step_end = on_step_end
        self.auto_steps = on_step_end is not None
        self._depth = 0
        self._stack: list[str] = []
        self._handles: list[Any] = []
        self._patches: list[tuple[Any, str, Any]] = []
        self._first_optimizer: "weakref.ref[torch.optim.Optimizer] | None" = None
        self._opt_depth = 0
        self.optimizer_steps = 0
        self.forward_calls = 0

    # -- install / remove ---------------------------------------------------------------
    def install(self) -> None:
        mm = nn.modules.module
        self._handles.append(mm.register_module_forward_pre_hook(self._fwd_pre))
        self._handles.append(mm.register_module_forward_hook(self._fwd_post, always_call=True))
        optim = _optim_mod
        self._handles.append(optim.register_optimizer_step_pre_hook(self._opt_pre))
        self._handles.append(optim.register_optimizer_step_post_hook(self._opt_post))
        self._patch(torch.autograd, "backward", self._wrap_backward(torch.autograd.backward))
        self._patch(torch.optim.Optimizer, "zero_grad", self._wrap_zero_grad(torch.optim.Optimizer.zero_grad))

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for owner, attr, original in reversed(self._patches):
            setattr(owner, attr, original)
        self._patches.clear()

    def _patch(self, owner: Any, attr: str, new: Any) -> None:
        self._patches.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, new)

    # -- explicit markers ---------------------------------------------------------------
    def mark(self, fields: str) -> None:
        if self.active:
            write_marker(fields)

    def phase(self, name: str) -> "_PhaseSpan":
        """Context manager marking an explicit phase (``data``, ``loss``, ...)."""
        return _PhaseSpan(self, name)

    # -- module hooks -------------------------------------------------------------------
    def _fwd_pre(self, module: nn.Module, args: Any) -> None:
        if self._depth == 0:
            self.names.register_root(module)
        self._depth += 1
        name = self.names.name(module)
        if name is None:  # a module created after its root was first seen
            name = _clean(type(module).__name__)
        self._stack.append(name)
        if self.active:
            kind = "loss" if self._depth == 1 and is_loss_module(module) else "fwd"
            write_marker(f"{kind}_begin,{self._depth - 1},{name}")

    def _fwd_post(self, module: nn.Module, args: Any, output: Any) -> None:
        name = self._stack.pop() if self._stack else (self.names.name(module) or type(module).__name__)
        self._depth = max(0, self._depth - 1)
        if self._depth == 0:
            self.forward_calls += 1
        if not self.active:
            return
        kind = "loss" if self._depth == 0 and is_loss_module(module) else "fwd"
        write_marker(f"{kind}_end,{self._depth},{name}")
        info = self.names.info.get(name)
        if info is not None and info["leaf"] and torch.is_grad_enabled():
            nodes: dict[int, Any] = {}
            _grad_nodes(output, nodes)
            for node in nodes.values():
                node.register_prehook(functools.partial(_bwd_begin, self, name))
                node.register_hook(functools.partial(_bwd_end, self, name))

    # -- phases from autograd and the optimizer -----------------------------------------
    def _wrap_backward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def backward(*args: Any, **kwargs: Any) -> Any:
            if self.on_backward is not None:
                self.on_backward(args[0] if args else kwargs.get("tensors"))
            self.mark("backward_begin")
            try:
                return original(*args, **kwargs)
            finally:
                self.mark("backward_end")

        return backward

    def _wrap_zero_grad(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def zero_grad(opt: Any, *args: Any, **kwargs: Any) -> Any:
            self.mark("opt_begin,zero_grad")
            try:
                return original(opt, *args, **kwargs)
            finally:
                self.mark("opt_end,zero_grad")

        return zero_grad

    def _opt_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._opt_depth += 1
        if self._opt_depth == 1:
            self.mark("opt_begin,step")

    def _opt_post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._opt_depth = max(0, self._opt_depth - 1)
        if self._opt_depth:
            return
        self.mark("opt_end,step")
        if self._first_optimizer is None:
            self._first_optimizer = weakref.ref(optimizer)
        self.optimizer_steps += 1
        # With several optimizers (a GAN), the first one that ever stepped ends the step.
        if self.auto_steps and self._first_optimizer() is optimizer and self.on_step_end:
            self.on_step_end()


def _bwd_begin(inst: Instrumentation, name: str, grad_outputs: Any) -> None:
    if inst.active:
        write_marker(f"bwd_begin,{name}")


def _bwd_end(inst: Instrumentation, name: str, grad_inputs: Any, grad_outputs: Any) -> None:
    if inst.active:
        write_marker(f"bwd_end,{name}")


class _PhaseSpan:
    def __init__(self, inst: Instrumentation, name: str) -> None:
        self.inst, self.name = inst, name

    def __enter__(self) -> None:
        self.inst.mark(f"phase_begin,{self.name}")

    def __exit__(self, *exc: object) -> None:
        self.inst.mark(f"phase_end,{self.name}")

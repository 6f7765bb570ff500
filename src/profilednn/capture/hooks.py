"""Global instrumentation: where each module, phase and step begins and ends.

Works on any model without edits: module forward hooks are registered globally
(``torch.nn.modules.module``), backward boundaries come from hooks on each leaf module's
gradient node (robust to in-place ops such as ``ReLU(inplace=True)``, unlike module
backward hooks), ``torch.autograd.backward`` is wrapped to mark the backward phase, and
the global optimizer step hooks mark optimizer time and step ends.

Every boundary becomes a marker line in the verbose stream (see ``verbose/markers.py``),
so primitives are attributed by their exact position in the log.
"""

from __future__ import annotations

import functools
import sys
import traceback
import weakref
from typing import Any, Callable

import torch
import torch.optim.optimizer as _optim_mod
import torch.utils.data.dataloader as _dataloader_mod
from torch import nn

from ..verbose.markers import (
    BACKWARD_BEGIN, BACKWARD_END, BWD_BEGIN, BWD_END, EVAL_BEGIN, EVAL_END, FWD_BEGIN, FWD_END, LOSS_BEGIN,
    LOSS_END, OPT_BEGIN, OPT_END, OPT_STEP, OPT_ZERO_GRAD, PHASE_BEGIN, PHASE_END,
)
from .forks import leave_forked_children
from .page_faults import write_capture_marker

_LOSS_BASES: tuple[type, ...] = (nn.modules.loss._Loss,)
COMPILED_SUFFIX = ":compiled"
_ORIG = "_orig_mod"
_MAX_PARENT_SEARCHES = 256  # bounds the cost for modules created anew in every step


def _compiling() -> bool:
    """True while Dynamo traces: hooks then do nothing, so compiled graphs stay unchanged."""
    return torch.compiler.is_compiling()


def is_compiled_wrapper(module: nn.Module) -> bool:
    """``torch.compile(module)`` returns an ``OptimizedModule`` wrapping the original."""
    return type(module).__name__ == "OptimizedModule" and isinstance(
        getattr(module, "__dict__", {}).get("_modules", {}).get(_ORIG), nn.Module)


def _display_name(sub_name: str) -> str:
    """``body._orig_mod.0`` -> ``body.0``: the wrapper of a compiled module is not a level."""
    parts = [p for p in sub_name.split(".") if p != _ORIG]
    return ".".join(parts)


def find_outermost_parent(module: nn.Module, max_frames: int = 40) -> nn.Module:
    """The outermost module, among the callers' ``self``, that holds ``module`` (itself if none).

    Lightning calls ``self.body(x)`` from ``training_step`` and never calls the
    LightningModule itself; naming from the caller that owns it keeps ``body.4``, not ``4``.
    Only the call stack is read (cheap), never the heap.
    """
    best = module
    frame = sys._getframe(1)
    for _ in range(max_frames):
        if frame is None:
            break
        code = frame.f_code  # a method's first argument (``self``) is the candidate owner
        owner = frame.f_locals.get(code.co_varnames[0]) if code.co_argcount else None
        if isinstance(owner, nn.Module) and owner is not best and _holds(owner, best):
            best = owner
        frame = frame.f_back
    return best


def _holds(owner: nn.Module, module: nn.Module) -> bool:
    return any(sub is module for sub in owner.modules())


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
        self._parent_searches = 0

    def register_called_root(self, module: nn.Module) -> None:
        """Name a module called outside any other: from its outermost parent when it has one."""
        if module in self._names:
            return
        root = module
        if self._parent_searches < _MAX_PARENT_SEARCHES:
            self._parent_searches += 1
            root = find_outermost_parent(module)
        self.register_root(root)
        if module not in self._names:  # the parent was named before this child existed
            self.register_root(module)

    def register_root(self, root: nn.Module, name: str | None = None) -> None:
        if root in self._names:
            return
        base = root.__dict__["_modules"][_ORIG] if is_compiled_wrapper(root) else root
        if name is None:
            name = type(base).__name__ if self._roots == 0 else f"{type(base).__name__}{self._roots}"
        self._roots += 1
        prefix = "" if self._roots == 1 else f"{name}."
        for sub_name, sub in root.named_modules():
            if sub in self._names:
                continue
            shown = _display_name(sub_name)
            compiled = is_compiled_wrapper(sub)
            full = _clean((name if shown == "" else prefix + shown) + (COMPILED_SUFFIX if compiled else ""))
            self._names[sub] = full
            own = list(sub.parameters(recurse=False))
            self.info[full] = {
                "module_type": type(sub).__name__,
                # a compiled region is opaque: its backward is one autograd node
                "leaf": compiled or len(list(sub.children())) == 0,
                "params": int(sum(p.numel() for p in own)),
                "trainable_params": int(sum(p.numel() for p in own if p.requires_grad)),
                "is_root": sub_name == "",
                "compiled": compiled,
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


class Installed:
    """Hook handles and attribute patches put into the user's process, taken out together:
    every handle removed, every patch undone in reverse order (``remove``). Capture's
    instrumentation and an optimize arm's recipe injection both keep theirs here."""

    def __init__(self) -> None:
        self._handles: list[Any] = []
        self._patches: list[tuple[Any, str, Any]] = []  # (owner, attribute, the original value)
        leave_forked_children(self)

    def in_forked_child(self) -> None:
        """A forked child (a DataLoader worker) runs without any of it (``capture/forks.py``)."""
        self.remove()

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for owner, attr, original in reversed(self._patches):
            setattr(owner, attr, original)
        self._patches.clear()


class Instrumentation(Installed):
    """Installs and removes the global hooks; emits markers only while ``active``."""

    def __init__(
        self,
        on_step_end: Callable[[], None] | None = None,
        on_backward: Callable[[Any], None] | None = None,
        on_eval: Callable[[bool], None] | None = None,
    ) -> None:
        super().__init__()
        self.names = ModuleNames()
        self.on_backward = on_backward
        self.on_eval = on_eval
        self.active = False
        self.on_step_end = on_step_end
        self.auto_steps = on_step_end is not None
        self._depth = 0
        # name, hidden (the module a compiled wrapper calls), its inputs' autograd nodes (``_input_nodes``)
        self._stack: list[tuple[str, bool, frozenset[int]]] = []
        self._mods: list[nn.Module] = []
        self._hook_ids: set[int] = set()
        self.compiled_regions: set[str] = set()
        self.optimizers: dict[str, dict[str, Any]] = {}
        self.fault: str | None = None  # our own error: instrumentation stops, the program runs on
        self._first_optimizer: "weakref.ref[torch.optim.Optimizer] | None" = None
        self._opt_depth = 0
        self.optimizer_steps = 0
        self.forward_calls = 0
        self._trained: set[int] = set()  # ids of the parameters an optimizer that stepped updates
        self._trained_counts: dict[int, int] = {}  # per optimizer, the parameters counted
        self._eval_depth = 0  # > 0 inside an evaluation call (``_is_evaluation``)
        self._fetching = 0  # > 0 while a DataLoader fetches a batch in this process (``_wrap_fetch``)
        self.eval_calls = 0  # evaluation calls seen while active

    # -- install / remove ---------------------------------------------------------------
    def install(self) -> None:
        mm = nn.modules.module
        self._handles.append(mm.register_module_forward_pre_hook(self._fwd_pre))
        self._handles.append(mm.register_module_forward_hook(self._fwd_post, always_call=True))
        self._hook_ids = {h.id for h in self._handles}
        # torch.compile warns on every call of an OptimizedModule while any global module
        # hook exists; ours fire nothing inside compiled code, so answer for the user's only.
        if callable(getattr(mm, "_has_any_global_hook", None)):
            self._patch(mm, "_has_any_global_hook", self._has_foreign_global_hook)
        optim = _optim_mod
        self._handles.append(optim.register_optimizer_step_pre_hook(self._opt_pre))
        self._handles.append(optim.register_optimizer_step_post_hook(self._opt_post))
        self._patch(torch.autograd, "backward", self._wrap_backward(torch.autograd.backward))
        self._patch(torch.optim.Optimizer, "zero_grad", self._wrap_zero_grad(torch.optim.Optimizer.zero_grad))
        fetcher = _dataloader_mod._BaseDataLoaderIter
        self._patch(fetcher, "__next__", self._wrap_fetch(fetcher.__next__))

    def in_forked_child(self) -> None:
        super().in_forked_child()
        self.active = False
        self.auto_steps = False

    def adopt(self, handles: list[Any]) -> None:
        """Global module hooks installed beside these (an optimize arm's recipe injection)
        count as ours: torch.compile then does not warn about them on the script's calls."""
        self._hook_ids.update(h.id for h in handles)

    def _has_foreign_global_hook(self) -> bool:
        mm = nn.modules.module
        tables = ("_global_backward_pre_hooks", "_global_backward_hooks", "_global_forward_pre_hooks",
                  "_global_forward_hooks", "_global_forward_hooks_always_called",
                  "_global_forward_hooks_with_kwargs")
        return any(k not in self._hook_ids for t in tables for k in getattr(mm, t, {}))

    def _patch(self, owner: Any, attr: str, new: Any) -> None:
        self._patches.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, new)

    def _fail(self, exc: BaseException) -> None:
        """An error in our own hooks must never reach the user's program: stop observing."""
        if self.fault is None:
            self.fault = "".join(traceback.format_exception(exc))
        self.active = False

    # -- explicit markers ---------------------------------------------------------------
    def mark(self, fields: str) -> None:
        if self.active:
            try:
                write_capture_marker(fields)
            except Exception as exc:  # recorded in self.fault, reported in the Run's notes
                self._fail(exc)

    def phase(self, name: str) -> "_PhaseSpan":
        """Context manager marking an explicit phase (``data``, ``loss``, ...)."""
        return _PhaseSpan(self, name)

    def _observe(self, step: Callable[..., None], *args: Any) -> None:
        """Run one observation step, unless Dynamo is tracing or observing already failed.

        An error here must never reach the user's program: it is recorded in ``self.fault``
        (reported in the Run's notes) and observing stops.
        """
        if _compiling() or self.fault is not None:
            return
        try:
            step(*args)
        except Exception as exc:
            self._fail(exc)

    # -- module hooks -------------------------------------------------------------------
    def _fwd_pre(self, module: nn.Module, args: Any) -> None:
        if not self._fetching:
            self._observe(self._enter, module, args)

    def _fwd_post(self, module: nn.Module, args: Any, output: Any) -> None:
        if not self._fetching:
            self._observe(self._leave, module, output)

    def _enter(self, module: nn.Module, args: Any) -> None:
        if self._depth == 0:
            self.names.register_called_root(module)
        name = self.names.name(module)
        if name is None:  # a module created after its root was first seen
            name = _clean(type(module).__name__)
        # The wrapper's own call of the original module is not a level of the model.
        hidden = bool(self._mods) and is_compiled_wrapper(self._mods[-1]) \
            and self._mods[-1].__dict__["_modules"].get(_ORIG) is module
        self._stack.append((name, hidden, self._input_nodes(name, args)))
        self._mods.append(module)
        if hidden:
            return
        self._depth += 1
        if self._eval_depth:
            self._eval_depth += 1
            return
        if self._depth == 1 and self._is_evaluation(module):
            self._eval_depth = 1
            if self.active:
                write_capture_marker(f"{EVAL_BEGIN},{name}")
                if self.on_eval is not None:
                    self.on_eval(True)
            return
        if self.active:
            if name.endswith(COMPILED_SUFFIX):
                self.compiled_regions.add(name)
            begin = LOSS_BEGIN if self._depth == 1 and is_loss_module(module) else FWD_BEGIN
            write_capture_marker(f"{begin},{self._depth - 1},{name}")

    def _leave(self, module: nn.Module, output: Any) -> None:
        if self._stack:
            name, hidden, inputs = self._stack.pop()
            self._mods.pop()
        else:
            name, hidden, inputs = (self.names.name(module) or type(module).__name__), False, frozenset()
        if hidden:
            return
        self._depth = max(0, self._depth - 1)
        if self._depth == 0:
            self.forward_calls += 1
        if self._eval_depth:
            self._eval_depth -= 1
            if self._eval_depth == 0 and self.active:
                self.eval_calls += 1
                if self.on_eval is not None:
                    self.on_eval(False)
                write_capture_marker(f"{EVAL_END},{name}")
            return
        if not self.active:
            return
        end = LOSS_END if self._depth == 0 and is_loss_module(module) else FWD_END
        write_capture_marker(f"{end},{self._depth},{name}")
        info = self.names.info.get(name)
        if info is not None and info["leaf"] and torch.is_grad_enabled():
            nodes: dict[int, Any] = {}
            _grad_nodes(output, nodes)
            for node in (n for key, n in nodes.items() if key not in inputs):
                node.register_prehook(functools.partial(_bwd_begin, self, name))
                node.register_hook(functools.partial(_bwd_end, self, name))

    def _input_nodes(self, name: str, args: Any) -> frozenset[int]:
        """The autograd nodes a leaf module's inputs came from, read before its forward runs
        (an in-place module, ``ReLU(inplace=True)``, gives its input a node of its own). An
        output that is an input (``Dropout(p=0)``, ``Identity``) has no backward of the
        module: hooking its node would give the module the backward of the layer before it."""
        info = self.names.info.get(name)
        if not (self.active and info is not None and info["leaf"] and torch.is_grad_enabled()):
            return frozenset()
        nodes: dict[int, Any] = {}
        _grad_nodes(args, nodes)
        return frozenset(nodes)

    def _is_evaluation(self, module: nn.Module) -> bool:
        """A call from outside any module, under ``no_grad``/``inference_mode``, of a module
        holding parameters an optimizer updates: the trained model evaluated or sampled, not
        a training step's forward (which needs gradients). A frozen teacher or backbone run
        under ``no_grad`` holds no trained parameter and stays a forward; before the first
        optimizer step nothing counts as an evaluation (an inference script)."""
        if torch.is_grad_enabled() or not self._trained:
            return False
        return any(id(p) in self._trained for p in module.parameters())

    # -- phases from autograd and the optimizer -----------------------------------------
    def _wrap_backward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def backward(*args: Any, **kwargs: Any) -> Any:
            if _compiling() or self.fault is not None:
                return original(*args, **kwargs)
            if self.on_backward is not None:
                try:
                    self.on_backward(args[0] if args else kwargs.get("tensors"))
                except Exception as exc:  # recorded in self.fault, reported in the Run's notes
                    self._fail(exc)
            self.mark(BACKWARD_BEGIN)
            try:
                return original(*args, **kwargs)
            finally:
                self.mark(BACKWARD_END)

        return backward

    def _wrap_zero_grad(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def zero_grad(opt: Any, *args: Any, **kwargs: Any) -> Any:
            if _compiling():
                return original(opt, *args, **kwargs)
            self.mark(f"{OPT_BEGIN},{OPT_ZERO_GRAD}")
            try:
                return original(opt, *args, **kwargs)
            finally:
                self.mark(f"{OPT_END},{OPT_ZERO_GRAD}")

        return zero_grad

    def _wrap_fetch(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """A DataLoader fetching a batch in this process (no workers, the HF ``Trainer``'s
        default): the modules its dataset calls (torchvision's transforms are ``nn.Module``s)
        are data work, not the model's layers: no marker, no name (the model's names keep no
        prefix); their time stays in the step's data phase, as in a forked worker."""
        @functools.wraps(original)
        def fetch(it: Any, *args: Any, **kwargs: Any) -> Any:
            self._fetching += 1
            try:
                return original(it, *args, **kwargs)
            finally:
                self._fetching -= 1

        return fetch

    def _opt_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._observe(self._opt_enter, optimizer)

    def _opt_post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._observe(self._opt_leave, optimizer)

    def _opt_enter(self, optimizer: torch.optim.Optimizer) -> None:
        cls = type(optimizer)
        key = f"{cls.__module__}.{cls.__qualname__}"
        if key not in self.optimizers:
            self.optimizers[key] = describe_optimizer(optimizer)
        held = sum(len(g["params"]) for g in optimizer.param_groups)
        if self._trained_counts.get(id(optimizer)) != held:  # new groups are picked up too
            self._trained_counts[id(optimizer)] = held
            self._trained.update(id(p) for g in optimizer.param_groups for p in g["params"])
        self._opt_depth += 1
        if self._opt_depth == 1:
            self.mark(f"{OPT_BEGIN},{OPT_STEP}")

    def _opt_leave(self, optimizer: torch.optim.Optimizer) -> None:
        self._opt_depth = max(0, self._opt_depth - 1)
        if self._opt_depth:
            return
        self.mark(f"{OPT_END},{OPT_STEP}")
        if self._first_optimizer is None:
            self._first_optimizer = weakref.ref(optimizer)
        self.optimizer_steps += 1
        # With several optimizers (a GAN), the first one that ever stepped ends the step.
        if self.auto_steps and self._first_optimizer() is optimizer and self.on_step_end:
            self.on_step_end()


def describe_optimizer(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer class the user really has, for advice that names real APIs."""
    import inspect

    cls = type(optimizer)
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    defaults = getattr(optimizer, "defaults", {}) or {}
    return {
        "class": cls.__qualname__,
        "module": cls.__module__,
        "accepts_fused": "fused" in params,
        "accepts_foreach": "foreach" in params,
        "fused": defaults.get("fused"),
        "foreach": defaults.get("foreach"),
        "differentiable": defaults.get("differentiable"),
        "params": int(sum(p.numel() for g in optimizer.param_groups for p in g["params"])),
    }


def _bwd_begin(inst: Instrumentation, name: str, grad_outputs: Any) -> None:
    inst.mark(f"{BWD_BEGIN},{name}")


def _bwd_end(inst: Instrumentation, name: str, grad_inputs: Any, grad_outputs: Any) -> None:
    inst.mark(f"{BWD_END},{name}")


class _PhaseSpan:
    def __init__(self, inst: Instrumentation, name: str) -> None:
        self.inst, self.name = inst, name

    def __enter__(self) -> None:
        self.inst.mark(f"{PHASE_BEGIN},{self.name}")

    def __exit__(self, *exc: object) -> None:
        self.inst.mark(f"{PHASE_END},{self.name}")

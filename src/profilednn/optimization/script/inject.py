"""The recipes, injected into the user's unmodified script in its own process.

An arm (``arm.py``) installs an ``Injector`` beside capture's observation layer before the
script starts. It finds the script's objects as they appear, records them (``ScriptFacts``)
and hands them to the chosen recipes' injections (``optimization/injection.py``; each
recipe's module defines its own), in the catalogue's injection order
(``recipe_catalogue.INJECTION_ORDER``). They change the objects in place, never the
script's source:

- **root modules** (a module with parameters called outside any other, not a loss): on its
  first call, ``frozen_weight_grads`` (``requires_grad=False`` on parameters no optimizer
  updates), ``channels_last`` (weights), ``fused_batchnorm`` (``fuse_batch_norm``; the
  module's ``forward`` becomes the fused graph's), ``pointwise_gemm`` (its 1x1
  convolutions swapped for ``PointwiseGemmConv2d``, before the batch norms are fused) and
  ``torch_compile`` (its ``forward``
  through ``torch.compile``; the first call runs eager). On every call: 4-D floating inputs
  in channels_last, the forward under ``torch.autocast('cpu', bfloat16)`` with floating
  outputs cast back to fp32 (``dtype_policy``: the loss stays fp32);
- **optimizers**, as the script builds them (``torch.optim.Optimizer.__init__``): the
  groups of torch's SGD/Adam/AdamW/Adagrad switched to ``fused``, other torch optimizers to
  ``foreach``, a LAMB's ``step`` taken by ``profilednn.kernels.FusedLAMB`` over the same
  groups and state (``fused_optimizer``);
- **DataLoaders** built with ``num_workers=0`` get one persistent worker
  (``dataloader_workers``);
- **DistributedDataParallel** models (``ddp_watch.py``): what the script passed and the comm
  hook it registered are recorded; the DDP recipes set the arguments it did not pass
  (``gradient_as_bucket_view``, ``static_graph``, ``bucket_cap_mb``) and register a BF16
  allreduce hook where it registered none;
- **torchvision's sigmoid_focal_loss**: its code object is swapped for a call of
  ``profilednn.kernels.sigmoid_focal_loss``, so every reference the script holds calls the
  kernel (``fused_loss``).

Every arm, the stock one included, records what it saw (``facts.py``). ``perturb``
multiplies each root's weights by (1 + perturb N(0, 1)) on first sight: the noise arms of
the numerics gate. With ``fused_dropout``, the option ``dropout_sites`` observes each fused
dropout site's first training call and its backward (``stream_gate.Site``; the hooks are
removed at the first optimizer step, before any timed step), and ``reseed`` reseeds torch's
generator at the first root call (the arm under another random stream). The option
``eager_random`` makes the compiled code draw its random numbers with eager PyTorch's
kernels (``torch._inductor.config.fallback_random``), so a numerics arm of ``torch_compile``
sees the same dropout masks as the arm it is judged against.
"""

from __future__ import annotations

import contextlib
import sys
import types
import weakref
from collections.abc import Collection, Iterator, Mapping
from importlib import import_module
from typing import Any

import torch
import torch.optim.optimizer as _optim_mod
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from ...capture.hooks import Installed, is_compiled_wrapper, is_loss_module
from ...kernels.dropout_fusion import dropout_sites
from ...recipe_catalogue import INJECTABLE, INJECTION_ORDER, entry
from ..injection import AttentionCall, Injection
from ..layout import conv2d_count, is_channels_last
from ..precision import has_compute_layers
from ..stream_gate import Site, observe_first_call
from .ddp_watch import DdpWatch
from .facts import OptimizerFacts, RootFacts, ScriptFacts

# The option ``reseed`` seeds torch's generator with seed + this at the first root call: the arm
# under another random stream, whose spread the random-stream gate measures.
RESEED_OFFSET = 1_000_003
_FOCAL_MODULE = "torchvision.ops.focal_loss"


def _compiling() -> bool:
    return torch.compiler.is_compiling()


def is_lamb(optimizer: torch.optim.Optimizer) -> bool:
    """A LAMB optimizer (timm's ``Lamb``, apex's ``FusedLAMB`` spelt otherwise, ours)."""
    from ..optimizers import is_lamb as lamb

    return lamb(optimizer)


def optimizer_plan(optimizer: torch.optim.Optimizer) -> tuple[str | None, str]:
    """What ``fused_optimizer`` does to ``optimizer`` (``optimizers.optimizer_plan``), and why."""
    from ..optimizers import optimizer_plan as plan

    return plan(optimizer)


def injections(recipes: Collection[str]) -> list[Injection]:
    """A fresh injection of each of ``recipes``, in injection order (each recipe's module is
    imported only when it is chosen)."""
    found = []
    for name in INJECTION_ORDER:
        if name in recipes:
            injection = import_module(entry(name).import_path).RECIPE.injection()
            if injection is not None:
                found.append(injection)
    return found


def leading_size(args: Any) -> int | None:
    """The leading size of the first tensor among a call's positional arguments (a batch's
    items), or None when the call passed no tensor with a dimension."""
    for arg in args if isinstance(args, (tuple, list)) else (args,):
        if isinstance(arg, torch.Tensor) and arg.dim() >= 1:
            return int(arg.shape[0])
    return None


def root_facts(module: nn.Module, args: Any) -> RootFacts:
    """What a root module is, at its first call (``args``: that call's positional arguments)."""
    from ..batchnorm import trainable_batch_norms
    from ..pointwise import trainable_pointwise_convolutions

    facts = RootFacts(
        module_type=type(module).__name__,
        params=int(sum(p.numel() for p in module.parameters())),
        conv2d=conv2d_count(module), batch_norms=trainable_batch_norms(module),
        pointwise_convolutions=trainable_pointwise_convolutions(module),
        compute_layers=has_compute_layers(module),
        compiled=is_compiled_wrapper(module) or getattr(module, "_compiled_call_impl", None) is not None,
        channels_last=is_channels_last(module),
        input_4d=any(isinstance(a, torch.Tensor) and a.dim() == 4 and a.is_floating_point() for a in args),
        autocast=str(torch.get_autocast_dtype("cpu")).replace("torch.", "")
        if torch.is_autocast_enabled("cpu") else None,
        batch=leading_size(args),
    )
    sites = dropout_sites(module)
    facts.dropouts, facts.dropout_attentions_left = sites.dropouts + sites.attentions, sites.attentions_left
    return facts


class Injector(Installed):
    """Installs the chosen recipes' hooks and patches; records ``facts``; ``applied`` says
    what each recipe did (one line each)."""

    def __init__(self, recipes: Collection[str] = (), options: Mapping[str, Any] | None = None,
                 perturb: float | None = None, seed: int = 0) -> None:
        unknown = sorted(set(recipes) - set(INJECTABLE))
        if unknown:
            raise ValueError(f"cannot inject {', '.join(unknown)} into a script")
        super().__init__()
        self.recipes = set(recipes)
        self.options = dict(options or {})
        self.perturb = perturb
        self.seed = seed
        self.facts = ScriptFacts()
        self.applied: dict[str, str] = {}
        self.injections = injections(self.recipes)
        self.module_hooks: list[Any] = []
        self._depth = 0
        self._calls: list[list[Any]] = []  # per module call in flight: what to do with its output
        self._roots: "weakref.WeakKeyDictionary[nn.Module, RootFacts]" = weakref.WeakKeyDictionary()
        self._optimizers: "weakref.WeakSet[torch.optim.Optimizer]" = weakref.WeakSet()
        self._loaders: set[int] = set()
        self._stepped = False
        self._focal_done = False
        self._building = False
        self._reseeded = False
        self.dropout_sites: list[Site] = []  # with the option dropout_sites: what each observed site did
        self._site_handles: list[Any] = []
        self.ddp = DdpWatch(self)

    def root_modules(self) -> list[nn.Module]:
        """The root modules the script called, in no particular order."""
        return list(self._roots.keys())

    # -- what an injection may use (``injection.ScriptProcess``) ----------------------------------
    def said(self, recipe: str, how: str) -> None:
        self.applied.setdefault(recipe, how)

    def patch(self, owner: Any, attr: str, new: Any) -> None:
        self._patches.append((owner, attr, owner.__dict__[attr]))
        setattr(owner, attr, new)

    def updated_parameters(self) -> set[int]:
        return {id(p) for opt in list(self._optimizers) for g in opt.param_groups
                if float(g.get("lr", 1.0)) != 0.0 for p in g["params"]}

    def observe_site(self, name: str, module: nn.Module) -> None:
        """Fill a ``Site`` for dropout module ``module`` from its first training call and that
        call's backward (``stream_gate.observe_first_call``)."""
        site = Site(name, float(module.p))
        self.dropout_sites.append(site)
        self._site_handles += observe_first_call(module, site)

    @property
    def building(self) -> bool:
        """Inside ``unobserved``: what is built or registered now is an injection's, not the script's."""
        return self._building

    @contextlib.contextmanager
    def unobserved(self) -> Iterator[None]:
        self._building = True
        try:
            yield
        finally:
            self._building = False

    # -- install / remove -------------------------------------------------------------------
    def install(self) -> None:
        mm = nn.modules.module
        self.module_hooks = [mm.register_module_forward_pre_hook(self._pre),
                             mm.register_module_forward_hook(self._post, always_call=True)]
        self._handles += self.module_hooks
        self._handles.append(_optim_mod.register_optimizer_step_pre_hook(self._opt_pre))
        self.patch(torch.optim.Optimizer, "__init__", self._wrap_optimizer_init(torch.optim.Optimizer.__init__))
        self.patch(DataLoader, "__iter__", self._wrap_loader_iter(DataLoader.__iter__))
        self.patch(F, "scaled_dot_product_attention", self._wrap_attention(F.scaled_dot_product_attention))
        self.ddp.install()
        for injection in self.injections:
            injection.install(self)

    def _stop_observing_dropouts(self) -> None:
        for handle in self._site_handles:
            handle.remove()
        self._site_handles.clear()
        for site in self.dropout_sites:
            site._x = site._y = None

    def remove(self) -> None:
        self._stop_observing_dropouts()
        super().remove()

    # -- root modules ---------------------------------------------------------------------------
    def _pre(self, module: nn.Module, args: Any) -> Any:
        if _compiling():
            return None
        depth, self._depth = self._depth, self._depth + 1
        if depth != 0 or is_loss_module(module) or next(module.parameters(), None) is None:
            self._calls.append([])
            return None
        if module not in self._roots:
            self._discover(module, args)
        new_args = args
        for injection in self.injections:
            new_args = injection.root_args(new_args)
        self._calls.append([leave for leave in (i.enter_root_call() for i in self.injections) if leave])
        return new_args if new_args is not args else None

    def _post(self, module: nn.Module, args: Any, output: Any) -> Any:
        if _compiling():
            return None
        self._depth = max(0, self._depth - 1)
        leaving = self._calls.pop() if self._calls else []
        if not leaving:
            return None
        for leave in reversed(leaving):
            output = leave(output)
        return output

    def _discover(self, module: nn.Module, args: Any) -> None:
        """First call of a root: record it, then let the chosen recipes change it."""
        facts = root_facts(module, args)
        self._roots[module] = facts
        self.facts.roots.append(facts)
        if facts.batch is None and not facts.compiled:
            self._batch_from_keywords(module, facts)
        if self.perturb:
            self._perturb(module)
        if self.options.get("reseed") and not self._reseeded:
            self._reseeded = True
            torch.manual_seed(self.seed + RESEED_OFFSET)
        self._patch_focal_loss()
        for injection in self.injections:
            injection.prepare_root(self, module, facts)
        for injection in self.injections:
            injection.inject_root(self, module, facts)

    def _batch_from_keywords(self, module: nn.Module, facts: RootFacts) -> None:
        """A root called with keyword arguments only (Hugging Face's Trainer calls
        ``model(**batch)``): the global pre-hook sees no keywords, so the batch is read at
        the root's next call by a hook of its own that then removes itself."""
        def read(_: nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
            handle.remove()
            facts.batch = leading_size([*args, *kwargs.values()])

        handle = module.register_forward_pre_hook(read, with_kwargs=True)
        self._handles.append(handle)

    def _perturb(self, module: nn.Module) -> None:
        generator = torch.Generator().manual_seed(self.seed + 1)
        with torch.no_grad():
            for p in module.parameters():
                if p.is_floating_point():
                    noise = torch.randn(p.shape, generator=generator, dtype=torch.float32).to(p.dtype)
                    p.mul_(noise.mul_(float(self.perturb or 0.0)).add_(1.0))

    def _wrap_attention(self, original: Any) -> Any:
        """``F.scaled_dot_product_attention`` that counts calls with dropout and offers each
        call to the injections (``fused_dropout`` takes those it can)."""
        injector = self

        def scaled_dot_product_attention(query: Any, key: Any, value: Any, attn_mask: Any = None,
                                         dropout_p: float = 0.0, is_causal: bool = False, scale: Any = None,
                                         enable_gqa: bool = False) -> Any:
            compiling = _compiling()  # traced: no bookkeeping
            if not compiling and dropout_p > 0.0:
                injector.facts.attention_dropout_calls += 1
            call = AttentionCall(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
            for injection in injector.injections:
                result = injection.attention(injector, compiling, call)
                if result is not NotImplemented:
                    return result
            extra = {"enable_gqa": True} if enable_gqa else {}
            return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                            scale=scale, **extra)

        scaled_dot_product_attention.__doc__ = original.__doc__
        return scaled_dot_product_attention

    # -- torchvision's focal loss ----------------------------------------------------------
    def _patch_focal_loss(self) -> None:
        """Swap the code of torchvision's sigmoid_focal_loss, so that every reference to it
        (``from torchvision.ops import ...`` included) calls what an injection offers instead
        (``fused_loss``: the kernel), or counts calls."""
        if self._focal_done or _FOCAL_MODULE not in sys.modules:
            return
        self._focal_done = True
        module = sys.modules[_FOCAL_MODULE]
        reference = getattr(module, "sigmoid_focal_loss", None)
        if not isinstance(reference, types.FunctionType):
            return
        target: Any = types.FunctionType(reference.__code__, reference.__globals__, "sigmoid_focal_loss",
                                         reference.__defaults__, reference.__closure__)
        for injection in self.injections:
            target = injection.focal_loss(self) or target
        facts = self.facts

        def counted(*args: Any, **kwargs: Any) -> Any:
            facts.focal_loss_calls += 1
            return target(*args, **kwargs)

        module.__dict__["_profilednn_focal_loss"] = counted
        trampoline = _focal_trampoline()
        self._patches.append((reference, "__code__", reference.__code__))
        reference.__code__ = trampoline.__code__

    # -- optimizers ---------------------------------------------------------------------------
    def _wrap_optimizer_init(self, original: Any) -> Any:
        injector = self

        def __init__(opt: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
            original(opt, *args, **kwargs)
            if injector._building:  # built by an injection (the FusedLAMB that takes over a LAMB's step)
                return
            injector._optimizers.add(opt)
            how, why = optimizer_plan(opt)
            cls = type(opt)
            injector.facts.optimizers.append(OptimizerFacts(cls.__qualname__, cls.__module__, how, why))
            for injection in injector.injections:
                injection.optimizer_created(injector, opt, how, why)

        return __init__

    def _opt_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._stepped or _compiling():
            return
        self._stepped = True
        self._stop_observing_dropouts()  # the first step's backward is done: no hook in a timed step
        self.ddp.first_step()
        updated = self.updated_parameters()
        seen: set[int] = set()
        for root in list(self._roots.keys()):
            for p in root.parameters():
                if id(p) not in seen and p.requires_grad and id(p) not in updated:
                    self.facts.unused_trainable += 1
                    self.facts.unused_trainable_values += p.numel()
                seen.add(id(p))

    # -- DataLoaders ------------------------------------------------------------------------------
    def _wrap_loader_iter(self, original: Any) -> Any:
        injector = self

        def __iter__(loader: DataLoader) -> Any:
            if id(loader) not in injector._loaders:
                injector._loaders.add(id(loader))
                injector.facts.loader_workers.append(int(loader.num_workers))
            return original(loader)

        return __iter__


def _focal_trampoline() -> types.FunctionType:
    """A function with torchvision's signature that calls ``_profilednn_focal_loss`` from
    the globals of the function whose code it replaces."""
    source = ("def sigmoid_focal_loss(inputs, targets, alpha=0.25, gamma=2, reduction='none'):\n"
              "    return _profilednn_focal_loss(inputs, targets, alpha=alpha, gamma=gamma, reduction=reduction)\n")
    namespace: dict[str, Any] = {}
    exec(compile(source, "<profilednn fused_loss>", "exec"), namespace)  # noqa: S102 - our own constant source
    return namespace["sigmoid_focal_loss"]


__all__ = ["INJECTABLE", "Injector", "RESEED_OFFSET", "injections", "is_lamb", "optimizer_plan", "root_facts"]

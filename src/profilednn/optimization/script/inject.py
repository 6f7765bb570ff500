"""The recipes, injected into the user's unmodified script in its own process.

An arm (``arm.py``) installs an ``Injector`` beside capture's observation layer before the
script starts. It finds the script's objects as they appear and changes them in place,
never the script's source:

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

import inspect
import sys
import types
import weakref
from collections.abc import Collection, Mapping
from typing import Any

import torch
import torch.optim.optimizer as _optim_mod
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from ...capture.hooks import Installed, is_compiled_wrapper, is_loss_module
from ...train_step import floating_to_fp32
from ...injectable_recipes import INJECTABLE  # what an arm can inject, in the order they act on a root
from ...kernels.aten_pool import keep_aten_pools
from ...kernels import attention
from ...kernels.dropout_fusion import dropout_sites
from ..compile import pools_note
from ..layout import conv2d_count, is_channels_last
from ..precision import has_compute_layers
from ..stream_gate import Site, observe_first_call
from .facts import OptimizerFacts, RootFacts, ScriptFacts

# The option ``reseed`` seeds torch's generator with seed + this at the first root call: the arm
# under another random stream, whose spread the random-stream gate measures.
RESEED_OFFSET = 1_000_003
_FOCAL_MODULE = "torchvision.ops.focal_loss"


def _compiling() -> bool:
    return torch.compiler.is_compiling()


def is_lamb(optimizer: torch.optim.Optimizer) -> bool:
    """A LAMB optimizer (timm's ``Lamb``, apex's ``FusedLAMB`` spelt otherwise, ours)."""
    return type(optimizer).__name__.lower() in ("lamb", "referencelamb")


def optimizer_plan(optimizer: torch.optim.Optimizer) -> tuple[str | None, str]:
    """What ``fused_optimizer`` does to ``optimizer`` (``optimizers.plan``; any LAMB class
    is offered ``FusedLAMB``), and why."""
    from ...kernels.lamb import FusedLAMB
    from ..optimizers import plan

    if is_lamb(optimizer) and not isinstance(optimizer, FusedLAMB):
        return "fused_lamb", f"{type(optimizer).__qualname__} (LAMB) -> profilednn.kernels.FusedLAMB"
    return plan(optimizer)


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
        self.module_hooks: list[Any] = []
        self._depth = 0
        self._calls: list[Any] = []  # per module call in flight: its autocast context (roots) or None
        self._roots: "weakref.WeakKeyDictionary[nn.Module, RootFacts]" = weakref.WeakKeyDictionary()
        self._optimizers: "weakref.WeakSet[torch.optim.Optimizer]" = weakref.WeakSet()
        self._loaders: set[int] = set()
        self._stepped = False
        self._focal_done = False
        self._building = False
        self._reseeded = False
        self.dropout_sites: list[Site] = []  # with the option dropout_sites: what each fused site did
        self._site_handles: list[Any] = []
        self._dropout_parts: list[str] = []  # what fused_dropout did, in the order it did it
        self._attention_dropout: Any = None  # the FusedDropout the fused attention calls use
        self._dropout_native = False  # whether the dropout kernel builds: asked at install, never in a trace

    # -- install / remove -------------------------------------------------------------------
    def install(self) -> None:
        mm = nn.modules.module
        self.module_hooks = [mm.register_module_forward_pre_hook(self._pre),
                             mm.register_module_forward_hook(self._post, always_call=True)]
        self._handles += self.module_hooks
        self._handles.append(_optim_mod.register_optimizer_step_pre_hook(self._opt_pre))
        self._patch(torch.optim.Optimizer, "__init__", self._wrap_optimizer_init(torch.optim.Optimizer.__init__))
        self._patch(DataLoader, "__iter__", self._wrap_loader_iter(DataLoader.__iter__))
        if "fused_dropout" in self.recipes:
            from ...kernels.dropout import native_available

            self._dropout_native = native_available()
        self._patch(F, "scaled_dot_product_attention", self._wrap_attention(F.scaled_dot_product_attention))
        if "dataloader_workers" in self.recipes:
            self._patch(DataLoader, "__init__", self._wrap_loader_init(DataLoader.__init__))

    def _patch(self, owner: Any, attr: str, new: Any) -> None:
        self._patches.append((owner, attr, owner.__dict__[attr]))
        setattr(owner, attr, new)

    def _said(self, recipe: str, how: str) -> None:
        self.applied.setdefault(recipe, how)

    # -- root modules ---------------------------------------------------------------------------
    def _pre(self, module: nn.Module, args: Any) -> Any:
        if _compiling():
            return None
        depth, self._depth = self._depth, self._depth + 1
        if depth != 0 or is_loss_module(module) or next(module.parameters(), None) is None:
            self._calls.append(None)
            return None
        if module not in self._roots:
            self._discover(module, args)
        new_args = args
        if "channels_last" in self.recipes:
            new_args = tuple(a.contiguous(memory_format=torch.channels_last)
                             if isinstance(a, torch.Tensor) and a.dim() == 4 and a.is_floating_point() else a
                             for a in args)
        ctx = None
        if "dtype_policy" in self.recipes:
            ctx = torch.autocast("cpu", dtype=torch.bfloat16)
            ctx.__enter__()
        self._calls.append(ctx)
        return new_args if new_args is not args else None

    def _post(self, module: nn.Module, args: Any, output: Any) -> Any:
        if _compiling():
            return None
        self._depth = max(0, self._depth - 1)
        ctx = self._calls.pop() if self._calls else None
        if ctx is None:
            return None
        ctx.__exit__(None, None, None)
        return floating_to_fp32(output)

    def _discover(self, module: nn.Module, args: Any) -> None:
        """First call of a root: record it, then apply the recipes that change the module."""
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
        )
        sites = dropout_sites(module)
        facts.dropouts, facts.dropout_attentions_left = sites.dropouts + sites.attentions, sites.attentions_left
        self._roots[module] = facts
        self.facts.roots.append(facts)
        if self.perturb:
            self._perturb(module)
        if self.options.get("reseed") and not self._reseeded:
            self._reseeded = True
            torch.manual_seed(self.seed + RESEED_OFFSET)
        self._patch_focal_loss()
        if "frozen_weight_grads" in self.recipes:
            self._freeze_unused(module)
        if "channels_last" in self.recipes:
            module.to(memory_format=torch.channels_last)  # same Parameter objects: optimizers keep them
            self._said("channels_last", f"{type(module).__name__}.to(memory_format=torch.channels_last) "
                       f"({facts.conv2d} convolutions); 4-D inputs converted on each call")
        pools: list[str] = []
        if "torch_compile" in self.recipes and not facts.compiled:
            pools = keep_aten_pools(module)  # before fuse_batch_norm: its traced graph keeps them as calls
        if "pointwise_gemm" in self.recipes and facts.pointwise_convolutions:
            self._pointwise_gemms(module)  # before fuse_batch_norm: its traced graph keeps them as calls
        if "fused_dropout" in self.recipes and facts.dropouts and not facts.compiled:
            self._fuse_dropout(module)  # before fuse_batch_norm: its traced graph keeps them as calls
        if "fused_batchnorm" in self.recipes and facts.batch_norms:
            self._fuse_batch_norm(module)
        if "torch_compile" in self.recipes and not facts.compiled:
            mode = self.options.get("compile_mode") or None
            if self.options.get("eager_random"):
                import torch._inductor.config as inductor_config

                inductor_config.fallback_random = True
            module.forward = torch.compile(module.forward, mode=mode)  # type: ignore[method-assign]
            self._said("torch_compile", f"{type(module).__name__}.forward = torch.compile(...)"
                       + (f" (mode={mode!r})" if mode else "") + "; the first call runs eager"
                       + pools_note(pools))
        if "dtype_policy" in self.recipes:
            self._said("dtype_policy", "torch.autocast('cpu', dtype=torch.bfloat16) around each call of "
                       f"{type(module).__name__}; floating outputs cast to fp32 before the loss")

    def _perturb(self, module: nn.Module) -> None:
        generator = torch.Generator().manual_seed(self.seed + 1)
        with torch.no_grad():
            for p in module.parameters():
                if p.is_floating_point():
                    noise = torch.randn(p.shape, generator=generator, dtype=torch.float32).to(p.dtype)
                    p.mul_(noise.mul_(float(self.perturb or 0.0)).add_(1.0))

    def _updated(self) -> set[int]:
        return {id(p) for opt in list(self._optimizers) for g in opt.param_groups
                if float(g.get("lr", 1.0)) != 0.0 for p in g["params"]}

    def _freeze_unused(self, module: nn.Module) -> None:
        updated = self._updated()
        if not updated:
            return  # no optimizer yet: nothing is known to be unused
        unused = [p for p in module.parameters() if p.requires_grad and id(p) not in updated]
        for p in unused:
            p.requires_grad_(False)
        if unused:
            self._said("frozen_weight_grads", f"requires_grad=False on {len(unused)} parameter tensors no optimizer "
                       f"updates ({sum(p.numel() for p in unused):,} values)")

    def _pointwise_gemms(self, module: nn.Module) -> None:
        from ...kernels.pointwise_conv import pointwise_gemms

        _, summary = pointwise_gemms(module)  # in place: the script's references stay valid
        self._said("pointwise_gemm", summary.describe())

    def _fuse_dropout(self, module: nn.Module) -> None:
        from ...kernels.dropout_fusion import fuse_dropout

        summary = fuse_dropout(module)  # in place: the script's references stay valid
        self._said_dropout(summary.describe())
        if self.options.get("dropout_sites"):
            for name, m in module.named_modules():
                if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0.0:
                    self._observe_site(name or type(m).__name__, m)

    def _said_dropout(self, part: str) -> None:
        if part not in self._dropout_parts:
            self._dropout_parts.append(part)
            self.applied["fused_dropout"] = "; ".join(self._dropout_parts)

    def _observe_site(self, name: str, m: nn.Module) -> None:
        """Fill a ``Site`` for dropout module ``m`` from its first training call and that
        call's backward (``stream_gate.observe_first_call``)."""
        site = Site(name, float(m.p))
        self.dropout_sites.append(site)
        self._site_handles += observe_first_call(m, site)

    def _attention_dropout_module(self) -> Any:
        """The one ``FusedDropout`` every fused attention call runs (observed as a site)."""
        if self._attention_dropout is None:
            from ...kernels.dropout import FusedDropout

            self._attention_dropout = FusedDropout(0.5)
            if self.options.get("dropout_sites"):
                self._observe_site("scaled_dot_product_attention", self._attention_dropout)
        return self._attention_dropout

    def _wrap_attention(self, original: Any) -> Any:
        """``F.scaled_dot_product_attention`` that counts calls with dropout and, with
        ``fused_dropout``, sends them to ``profilednn.kernels.scaled_dot_product_attention``."""
        injector = self

        def scaled_dot_product_attention(query: Any, key: Any, value: Any, attn_mask: Any = None,
                                         dropout_p: float = 0.0, is_causal: bool = False, scale: Any = None,
                                         enable_gqa: bool = False) -> Any:
            extra = {"enable_gqa": True} if enable_gqa else {}
            fuse = "fused_dropout" in injector.recipes and attention.applies(
                query, key, value, attn_mask, dropout_p, is_causal, enable_gqa, injector._dropout_native)
            if _compiling():  # traced: no bookkeeping; the fused path traces as math plus the opaque dropout op
                if fuse:
                    return attention.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal,
                                                                  scale, native=True)
                return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                                scale=scale, **extra)
            if dropout_p > 0.0:
                injector.facts.attention_dropout_calls += 1
            if fuse:
                injector._said_dropout("F.scaled_dot_product_attention with dropout_p > 0 -> "
                                       "profilednn.kernels.scaled_dot_product_attention (probabilities' dropout fused)")
                return attention.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal,
                                                              scale, dropout=injector._attention_dropout_module(),
                                                              native=True)
            return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                            scale=scale, **extra)

        scaled_dot_product_attention.__doc__ = original.__doc__
        return scaled_dot_product_attention

    def _stop_observing_dropouts(self) -> None:
        for handle in self._site_handles:
            handle.remove()
        self._site_handles.clear()
        for site in self.dropout_sites:
            site._x = site._y = None

    def remove(self) -> None:
        self._stop_observing_dropouts()
        super().remove()

    def _fuse_batch_norm(self, module: nn.Module) -> None:
        from ...kernels.batch_norm_fusion import fuse_batch_norm

        fused, summary = fuse_batch_norm(module)
        if fused is not module:  # a traced graph over the same parameters: it becomes the forward

            def forward(*args: Any, **kwargs: Any) -> Any:
                if fused.training != module.training:
                    fused.train(module.training)
                return fused(*args, **kwargs)

            module.forward = forward  # type: ignore[method-assign]
        self._said("fused_batchnorm", summary.describe())

    # -- torchvision's focal loss ----------------------------------------------------------
    def _patch_focal_loss(self) -> None:
        """Swap the code of torchvision's sigmoid_focal_loss, so that every reference to it
        (``from torchvision.ops import ...`` included) calls the kernel, or counts calls."""
        if self._focal_done or _FOCAL_MODULE not in sys.modules:
            return
        self._focal_done = True
        module = sys.modules[_FOCAL_MODULE]
        reference = getattr(module, "sigmoid_focal_loss", None)
        if not isinstance(reference, types.FunctionType):
            return
        original = types.FunctionType(reference.__code__, reference.__globals__, "sigmoid_focal_loss",
                                      reference.__defaults__, reference.__closure__)
        if "fused_loss" in self.recipes:
            from ...kernels import sigmoid_focal_loss

            target: Any = sigmoid_focal_loss
            self._said("fused_loss", "torchvision.ops.sigmoid_focal_loss -> profilednn.kernels.sigmoid_focal_loss "
                       "(every reference the script holds)")
        else:
            target = original
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
            if injector._building:  # the FusedLAMB that takes over a LAMB's step
                return
            injector._optimizers.add(opt)
            how, why = optimizer_plan(opt)
            cls = type(opt)
            injector.facts.optimizers.append(OptimizerFacts(cls.__qualname__, cls.__module__, how, why))
            if how and "fused_optimizer" in injector.recipes:
                injector._fuse_optimizer(opt, how, why)

        return __init__

    def _fuse_optimizer(self, opt: torch.optim.Optimizer, how: str, why: str) -> None:
        if how == "fused_lamb":
            from ...kernels.lamb import FusedLAMB

            keys = ("params", "lr", "betas", "eps", "weight_decay")
            self._building = True
            try:
                fused = FusedLAMB([{k: g[k] for k in keys} for g in opt.param_groups])
            finally:
                self._building = False
            fused.param_groups = opt.param_groups  # the script's scheduler changes these
            fused.state = opt.state
            opt.step = fused.step  # type: ignore[method-assign]
        else:
            for key in ("fused", "foreach"):
                value = (key == "fused") if how == "fused" else (True if key == "foreach" else None)
                opt.defaults[key] = value
                for g in opt.param_groups:
                    g[key] = value
        self._said("fused_optimizer", why)

    def _opt_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._stepped or _compiling():
            return
        self._stepped = True
        self._stop_observing_dropouts()  # the first step's backward is done: no hook in a timed step
        updated = self._updated()
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

    def _wrap_loader_init(self, original: Any) -> Any:
        injector = self
        signature = inspect.signature(original)

        def __init__(loader: DataLoader, *args: Any, **kwargs: Any) -> None:
            bound = signature.bind(loader, *args, **kwargs)
            if int(bound.arguments.get("num_workers", 0) or 0) == 0:
                bound.arguments["num_workers"] = 1
                bound.arguments["persistent_workers"] = True
                injector._said("dataloader_workers", "DataLoader num_workers 0 -> 1 (persistent)")
            original(*bound.args, **bound.kwargs)

        return __init__


def _focal_trampoline() -> types.FunctionType:
    """A function with torchvision's signature that calls ``_profilednn_focal_loss`` from
    the globals of the function whose code it replaces."""
    source = ("def sigmoid_focal_loss(inputs, targets, alpha=0.25, gamma=2, reduction='none'):\n"
              "    return _profilednn_focal_loss(inputs, targets, alpha=alpha, gamma=gamma, reduction=reduction)\n")
    namespace: dict[str, Any] = {}
    exec(compile(source, "<profilednn fused_loss>", "exec"), namespace)  # noqa: S102 - our own constant source
    return namespace["sigmoid_focal_loss"]


__all__ = ["INJECTABLE", "Injector", "RESEED_OFFSET", "is_lamb", "optimizer_plan"]

"""The script's ``DistributedDataParallel`` models, as it builds them.

An arm patches ``DistributedDataParallel.__init__`` and ``register_comm_hook`` (through the
injector's patches, undone on remove). Every arm, the stock one included, records what the
script passed of the arguments the DDP recipes tune, the comm hook it registered and the
module's gradient bytes (``DdpFacts``); the chosen recipes' injections change the arguments
the script did not pass (``Injection.ddp_arguments``) and act on the model once it is built
(``Injection.ddp_created``). At the first optimizer step: the parameters without a gradient
(what ``static_graph`` must know when the script finds unused parameters), the training
frameworks the script imported (``TRAINERS``) and the default process group's size, against
the ``WORLD_SIZE`` the process started with (read before the script runs: a script that
starts its own ranks, as Lightning's ``strategy="ddp"`` does without a launcher, sets it in
its own environment first).
"""

from __future__ import annotations

import inspect
import sys
import weakref
from typing import Any, Protocol

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ...capture.own_ranks import launched_world_size
from ..injection import Injection, ScriptProcess
from .facts import DdpFacts

# Training frameworks that build the process group and DistributedDataParallel themselves:
# what the messages about a launched script's ranks name (module name -> what users call it).
TRAINERS = {"pytorch_lightning": "Lightning", "lightning": "Lightning", "transformers.trainer": "Hugging Face"}

# The arguments recorded as the script passed them (None: not passed, DDP's default).
RECORDED = ("gradient_as_bucket_view", "static_graph", "bucket_cap_mb", "find_unused_parameters")


def gradient_bytes(module: nn.Module) -> int:
    """Bytes of the gradients DDP reduces for ``module``: its parameters that require grad."""
    seen: dict[int, torch.Tensor] = {id(p): p for p in module.parameters() if p.requires_grad}
    return int(sum(p.numel() * p.element_size() for p in seen.values()))


def passed_facts(arguments: dict[str, Any]) -> DdpFacts:
    """What the script passed to ``DistributedDataParallel`` (its arguments by name)."""
    module = arguments["module"]
    facts = DdpFacts(type(module).__name__, gradient_bytes=gradient_bytes(module))
    for name in RECORDED:
        if arguments.get(name) is not None:
            setattr(facts, name, arguments[name])
    caps = arguments.get("bucket_cap_mb_list")
    if caps:
        facts.bucket_cap_mb = float(max(caps))
    return facts


def default_world_size() -> int | None:
    """The default process group's size, or None when the script initialised none."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else None


class WatchingProcess(ScriptProcess, Protocol):
    """What the watch uses of the injector (``inject.Injector``)."""

    injections: list[Injection]  # the chosen recipes', in injection order

    @property
    def building(self) -> bool:
        """Inside ``unobserved``: what is registered now is an injection's, not the script's."""


class DdpWatch:
    """Records each ``DistributedDataParallel`` the script builds into the injector's facts
    and hands it to the injector's injections."""

    def __init__(self, injector: WatchingProcess) -> None:
        self.injector = injector
        self._models: "weakref.WeakKeyDictionary[nn.Module, DdpFacts]" = weakref.WeakKeyDictionary()
        injector.facts.launched_world_size = launched_world_size()  # before the script starts

    def install(self) -> None:
        self.injector.patch(DistributedDataParallel, "__init__", self._wrap_init(DistributedDataParallel.__init__))
        self.injector.patch(DistributedDataParallel, "register_comm_hook",
                            self._wrap_register(DistributedDataParallel.register_comm_hook))

    def _wrap_init(self, original: Any) -> Any:
        watch, signature = self, inspect.signature(original)

        def __init__(model: DistributedDataParallel, *args: Any, **kwargs: Any) -> None:
            bound = signature.bind(model, *args, **kwargs)
            facts = passed_facts(bound.arguments)
            for injection in watch.injector.injections:
                injection.ddp_arguments(watch.injector, bound.arguments, facts)
            original(*bound.args, **bound.kwargs)
            facts.world_size = int(model.process_group.size())
            watch._models[model] = facts
            watch.injector.facts.ddp.append(facts)
            for injection in watch.injector.injections:
                injection.ddp_created(watch.injector, model, facts)

        return __init__

    def _wrap_register(self, original: Any) -> Any:
        watch = self

        def register_comm_hook(model: DistributedDataParallel, state: object, hook: Any) -> None:
            facts = watch._models.get(model)
            if facts is not None and not watch.injector.building:  # the script's own hook
                facts.comm_hook = getattr(hook, "__qualname__", type(hook).__qualname__)
            original(model, state, hook)

        return register_comm_hook

    def first_step(self) -> None:
        """At the script's first optimizer step: each model's parameters without a gradient,
        and the default process group's size."""
        self.injector.facts.world_size = default_world_size()
        self.injector.facts.frameworks = sorted({name for module, name in TRAINERS.items() if module in sys.modules})
        for model, facts in list(self._models.items()):
            facts.unused_parameters = sum(1 for p in model.module.parameters() if p.requires_grad and p.grad is None)


__all__ = ["DdpWatch", "RECORDED", "TRAINERS", "WatchingProcess", "default_world_size", "gradient_bytes", "passed_facts"]

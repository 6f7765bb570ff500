"""Put ``FusedBatchNorm2d`` into a model: every ``nn.BatchNorm2d`` runs the fused kernels,
and where the graph allows, the ReLU (and residual add) after it run inside the same pass.

With ``torch.fx`` the model's forward is traced once and rewritten where a batch norm's
output feeds *only*

- a ReLU (``nn.ReLU``, ``F.relu``, ``torch.relu``, ``.relu()``, in place or not):
  ``relu(bn(x))`` -> ``fused(x)`` with ``relu=True``;
- an add whose result feeds only a ReLU (a ResNet block's tail):
  ``relu(bn(x) + r)`` -> ``fused(x, r)`` with ``relu=True``.

A model that ``torch.fx`` cannot trace (data-dependent control flow, as in torchvision's
detection models) keeps its own forward; its batch norms are swapped in place for fused
ones without the ReLU. Either way parameters and buffers are the model's own objects (an
optimizer built on the model keeps working) and the state dict keys are unchanged.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
from torch import fx, nn
from torch.nn import functional as F

from .batch_norm import FusedBatchNorm2d
from .compile_cache import KeyedOnKernels

_RELU_FUNCTIONS = {F.relu, torch.relu, torch.relu_}
_RELU_METHODS = {"relu", "relu_"}
_ADDS = {operator.add, operator.iadd, torch.add}


@dataclass
class FusionSummary:
    """What ``fuse_batch_norm`` did: batch norms swapped, with a ReLU, with an add + ReLU,
    and whether the forward was rewritten (traced) or only its modules swapped (and why)."""

    batch_norms: int = 0
    with_relu: int = 0
    with_add_relu: int = 0
    traced: bool = False
    why_not_traced: str | None = None
    names: list[str] = field(default_factory=list)

    def describe(self) -> str:
        text = (f"{self.batch_norms} BatchNorm2d -> FusedBatchNorm2d (C kernels); "
                f"{self.with_relu} with the ReLU after them, {self.with_add_relu} with the residual add + ReLU")
        if not self.traced:
            text += f" (forward not rewritten: {self.why_not_traced}; ReLU and adds stay separate)"
        return text


def _is_batch_norm(module: nn.Module) -> bool:
    return type(module) is nn.BatchNorm2d or type(module) is FusedBatchNorm2d


def _is_relu(node: fx.Node, source: fx.Node, modules: dict[str, nn.Module]) -> bool:
    """Whether ``node`` is a ReLU of ``source`` (module, function or method; in place or not)."""
    if not node.args or node.args[0] is not source:
        return False
    if node.op == "call_module":
        return isinstance(modules.get(str(node.target)), nn.ReLU)
    if node.op == "call_function":
        return node.target in _RELU_FUNCTIONS
    return node.op == "call_method" and node.target in _RELU_METHODS and len(node.args) == 1


def _only_user(node: fx.Node) -> fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _add_operand(add: fx.Node, bn: fx.Node) -> fx.Node | None:
    """The other operand of ``bn + other`` (plain add, no alpha), or None."""
    if add.op != "call_function" or add.target not in _ADDS or add.kwargs or len(add.args) != 2:
        return None
    a, b = add.args
    other = b if a is bn else a if b is bn else None
    return other if isinstance(other, fx.Node) and other is not bn else None


def _swap_modules(model: nn.Module, summary: FusionSummary) -> nn.Module:
    """Every BatchNorm2d replaced in place by a FusedBatchNorm2d sharing its tensors."""
    for parent_name, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.BatchNorm2d:
                setattr(parent, name, FusedBatchNorm2d.from_batch_norm(child))
                summary.batch_norms += 1
                summary.names.append(f"{parent_name}.{name}" if parent_name else name)
    return model


def _rewrite(gm: fx.GraphModule, summary: FusionSummary) -> None:
    modules = dict(gm.named_modules())
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_module" or not _is_batch_norm(modules[str(node.target)]) or len(node.args) != 1 \
                or node.kwargs:
            continue
        target = str(node.target)
        fused = FusedBatchNorm2d.from_batch_norm(modules[target])
        user = _only_user(node)
        if user is not None and _is_relu(user, node, modules):
            fused.relu = True
            user.replace_all_uses_with(node)
            graph.erase_node(user)
            summary.with_relu += 1
        elif user is not None and (other := _add_operand(user, node)) is not None:
            relu = _only_user(user)
            if relu is not None and _is_relu(relu, user, modules):
                fused.relu = True
                # at the add's place: the residual may be computed after the batch norm
                with graph.inserting_after(user):
                    call = graph.call_module(target, (node.args[0], other))
                relu.replace_all_uses_with(call)
                graph.erase_node(relu)
                graph.erase_node(user)
                graph.erase_node(node)
                summary.with_add_relu += 1
        _set_submodule(gm, target, fused)
        summary.batch_norms += 1
        summary.names.append(target)
    graph.lint()
    gm.recompile()


class _LeafTracer(fx.Tracer):
    """torch.fx's tracer, keeping this package's own modules (every ``KeyedOnKernels``: a
    ``PointwiseGemmConv2d``, an ``AtenMaxPool2d``, a ``FusedDropout``, a ``FusedBatchNorm2d``
    fused before) as calls: their forwards decide at run time (training, autocast) what a
    trace would fix once."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return isinstance(m, KeyedOnKernels) or super().is_leaf_module(m, module_qualified_name)


def _set_submodule(root: nn.Module, target: str, module: nn.Module) -> None:
    parent_name, _, name = target.rpartition(".")
    setattr(root.get_submodule(parent_name) if parent_name else root, name, module)


def fuse_batch_norm(model: nn.Module, trace: bool = True) -> tuple[nn.Module, FusionSummary]:
    """``model`` with fused batch norms (see the module doc): a rewritten ``fx.GraphModule``
    when ``trace`` and tracing succeed, else ``model`` itself with its modules swapped."""
    summary = FusionSummary()
    if trace:
        try:
            tracer = _LeafTracer()
            graph = tracer.trace(model)
            gm = fx.GraphModule(tracer.root, graph, type(model).__name__)
        except Exception as exc:  # any tracing failure means: keep the model's own forward
            summary.why_not_traced = f"torch.fx cannot trace {type(model).__name__} ({type(exc).__name__})"
        else:
            _rewrite(gm, summary)
            summary.traced = True
            gm.train(model.training)
            return gm, summary
    else:
        summary.why_not_traced = "tracing switched off"
    return _swap_modules(model, summary), summary


__all__ = ["FusionSummary", "fuse_batch_norm"]

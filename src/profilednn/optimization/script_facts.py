"""What an arm saw of the user's script: its root modules, optimizers, DataLoaders, loss and
DistributedDataParallel models.

The stock arm records these through the observation layer (module, optimizer and
DataLoader hooks; ``script/inject.py``), returns them as JSON, and the parent decides from
them which recipes apply (each recipe's ``script_check``, through ``script/checks.py``).
Plain data only: it crosses a process boundary. Here, below the recipe modules and
``script/``, so that both read it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class RootFacts:
    """One root module: a module with parameters the script called outside any other."""

    module_type: str
    params: int = 0
    conv2d: int = 0
    batch_norms: int = 0
    pointwise_convolutions: int = 0  # trainable 1x1 Conv2d that pointwise_gemm computes as GEMMs
    dropouts: int = 0  # nn.Dropout (p > 0) and nn.MultiheadAttention with dropout that fused_dropout takes
    dropout_attentions_left: int = 0  # attentions with dropout in a form fused_dropout does not take
    compute_layers: bool = False  # convolution, linear or recurrent layers (what BF16 speeds up)
    compiled: bool = False  # the script compiled it (torch.compile(model) or model.compile())
    channels_last: bool = False  # every 4-D weight already channels_last
    input_4d: bool = False  # its first call had a 4-D floating tensor argument
    autocast: str | None = None  # the script's own CPU autocast dtype around its call
    batch: int | None = None  # leading size of its first call's first tensor argument (keywords only: its second call's)


@dataclass
class OptimizerFacts:
    """One optimizer the script created: its class and what ``fused_optimizer`` would do."""

    cls: str
    module: str
    plan: str | None  # "fused", "foreach", "fused_lamb" or None
    why: str


@dataclass
class DdpFacts:
    """One model the script wrapped in ``DistributedDataParallel``: the arguments it passed
    (None: not passed, DDP's default), the comm hook it registered, its gradients."""

    module_type: str  # the wrapped module's class
    gradient_bytes: int = 0  # bytes of the gradients DDP reduces each step (parameters that require grad)
    world_size: int = 1  # ranks in its process group
    gradient_as_bucket_view: bool | None = None
    static_graph: bool | None = None
    bucket_cap_mb: float | None = None  # the largest of bucket_cap_mb_list where the script passed a list
    find_unused_parameters: bool | None = None
    comm_hook: str | None = None  # the qualified name of the comm hook the script registered itself
    unused_parameters: int = 0  # parameters that require grad and had no gradient at the first optimizer step


@dataclass
class ScriptFacts:
    """Everything the recipes' ``script_check`` needs to say whether a recipe applies to the script."""

    roots: list[RootFacts] = field(default_factory=list)
    optimizers: list[OptimizerFacts] = field(default_factory=list)
    unused_trainable: int = 0  # parameter tensors that require grad but no optimizer updates
    unused_trainable_values: int = 0
    loader_workers: list[int] = field(default_factory=list)  # num_workers of each DataLoader iterated
    focal_loss_calls: int = 0  # calls of torchvision.ops.sigmoid_focal_loss
    attention_dropout_calls: int = 0  # calls of F.scaled_dot_product_attention with dropout_p > 0
    ddp: list[DdpFacts] = field(default_factory=list)  # each DistributedDataParallel the script built
    world_size: int | None = None  # the default process group's size at the first optimizer step (None: none)
    launched_world_size: int | None = None  # WORLD_SIZE the process started with (a launcher's rank; None: none)
    frameworks: list[str] = field(default_factory=list)  # training frameworks imported by the first step (TRAINERS)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ScriptFacts":
        return cls(
            roots=[RootFacts(**r) for r in d.get("roots") or []],
            optimizers=[OptimizerFacts(**o) for o in d.get("optimizers") or []],
            unused_trainable=int(d.get("unused_trainable") or 0),
            unused_trainable_values=int(d.get("unused_trainable_values") or 0),
            loader_workers=[int(w) for w in d.get("loader_workers") or []],
            focal_loss_calls=int(d.get("focal_loss_calls") or 0),
            attention_dropout_calls=int(d.get("attention_dropout_calls") or 0),
            ddp=[DdpFacts(**m) for m in d.get("ddp") or []],
            world_size=None if d.get("world_size") is None else int(d["world_size"]),
            launched_world_size=None if d.get("launched_world_size") is None else int(d["launched_world_size"]),
            frameworks=[str(f) for f in d.get("frameworks") or []],
        )


def no_root(facts: ScriptFacts) -> str | None:
    """Why a recipe that changes the model cannot act: the script called no root module."""
    if not facts.roots:
        return "the script called no module with parameters before its first optimizer step"
    return None


__all__ = ["DdpFacts", "OptimizerFacts", "RootFacts", "ScriptFacts", "no_root"]

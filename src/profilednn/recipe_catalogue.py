"""The optimize recipes at a glance, importable without torch: one line per recipe, in the
order ``optimize`` tries them.

Each line says where the recipe is defined (its module, relative to ``profilednn``; the
module's ``RECIPE`` is the recipe), whether ``optimize -- python train.py`` can inject it
into a script and where it acts among the injected ones, which gate judges it, whether it
acts at process start, and the advice rules that lead to it. The advice, the search
(``optimization/recipes.py: load_recipes``), the script injector and the docs read it; the
analysis ranks below ``optimization`` and may not import it, so this lives below every job.
A new recipe adds its module and one line here; other modules name a recipe through the
constants below, never by spelling it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# The gate that judges a recipe (``optimization/gate.py``): ``arithmetic`` (against the arm at
# its precision), ``precision`` (a reduced number format: ``precision_gate.py``),
# ``environment`` (changes no arithmetic: same losses as the arm), ``random_stream`` (draws
# other random numbers: its gate, then ``stream_gate.py`` with dropout on).
GateKind = Literal["arithmetic", "precision", "environment", "random_stream"]

FROZEN_WEIGHT_GRADS = "frozen_weight_grads"
FROZEN_BATCHNORM = "frozen_batchnorm"
FUSED_LOSS = "fused_loss"
FUSED_OPTIMIZER = "fused_optimizer"
CHANNELS_LAST = "channels_last"
DTYPE_POLICY = "dtype_policy"
FUSED_BATCHNORM = "fused_batchnorm"
POINTWISE_GEMM = "pointwise_gemm"
FUSED_DROPOUT = "fused_dropout"
TORCH_COMPILE = "torch_compile"
DATALOADER_WORKERS = "dataloader_workers"
DDP_BUCKET_VIEW = "ddp_bucket_view"
DDP_STATIC_GRAPH = "ddp_static_graph"
DDP_BUCKET_SIZE = "ddp_bucket_size"
DDP_BF16_ALLREDUCE = "ddp_bf16_allreduce"
THREADS = "threads"
ALLOCATOR = "allocator"


@dataclass(frozen=True)
class RecipeEntry:
    """One recipe: ``name``; ``module`` (dotted, relative to ``profilednn``) whose ``RECIPE``
    it is; ``injected_at``: its place among the recipes injected into a script, the order
    they act on a root module and the order of the code edits (None: not injectable);
    ``gate``; ``process_start``: it acts only when a process starts (measured in child
    processes); ``advice_rules``: the advice rules it acts on."""

    name: str
    module: str
    injected_at: int | None
    gate: GateKind
    process_start: bool = False
    advice_rules: tuple[str, ...] = ()

    @property
    def injectable(self) -> bool:
        return self.injected_at is not None

    @property
    def import_path(self) -> str:
        """The module's absolute name (``profilednn.optimization.loss``)."""
        return f"profilednn.{self.module}"


# In the order optimize tries them: cheap, safe, in-process changes first; torch.compile after
# them; then the script's DistributedDataParallel (its arguments, then BF16 gradients);
# process-level settings last.
CATALOGUE: tuple[RecipeEntry, ...] = (
    RecipeEntry(FROZEN_WEIGHT_GRADS, "optimization.frozen", 10, "arithmetic", advice_rules=(FROZEN_WEIGHT_GRADS,)),
    RecipeEntry(FROZEN_BATCHNORM, "optimization.frozen_batchnorm", None, "arithmetic",
                advice_rules=("frozen_batchnorm_unfused",)),
    RecipeEntry(FUSED_LOSS, "optimization.loss", 80, "arithmetic", advice_rules=(FUSED_LOSS,)),
    RecipeEntry(FUSED_OPTIMIZER, "optimization.optimizers", 20, "arithmetic", advice_rules=(FUSED_OPTIMIZER,)),
    RecipeEntry(CHANNELS_LAST, "optimization.layout", 30, "arithmetic", advice_rules=(CHANNELS_LAST,)),
    RecipeEntry(DTYPE_POLICY, "optimization.precision", 40, "precision",
                advice_rules=("bf16_without_native_bf16", "bf16_native", "bf16_loss")),
    RecipeEntry(FUSED_BATCHNORM, "optimization.batchnorm", 70, "arithmetic", advice_rules=("batchnorm_passes",)),
    RecipeEntry(POINTWISE_GEMM, "optimization.pointwise", 50, "arithmetic", advice_rules=("conv_weight_grad",)),
    RecipeEntry(FUSED_DROPOUT, "optimization.dropout", 60, "random_stream", advice_rules=("dropout_masks",)),
    RecipeEntry(TORCH_COMPILE, "optimization.compile", 90, "arithmetic", advice_rules=("fragmentation",)),
    RecipeEntry(DATALOADER_WORKERS, "optimization.data", 100, "environment", advice_rules=("data_loading",)),
    RecipeEntry(DDP_BUCKET_VIEW, "optimization.ddp_bucket_view", 110, "environment"),
    RecipeEntry(DDP_STATIC_GRAPH, "optimization.ddp_static_graph", 120, "environment"),
    RecipeEntry(DDP_BUCKET_SIZE, "optimization.ddp_bucket_size", 130, "arithmetic"),
    RecipeEntry(DDP_BF16_ALLREDUCE, "optimization.ddp_bf16_allreduce", 140, "precision"),
    RecipeEntry(THREADS, "optimization.threads", None, "environment", process_start=True,
                advice_rules=("threads_vs_cores", "native_conv_fallback")),
    RecipeEntry(ALLOCATOR, "optimization.process", None, "environment", process_start=True,
                advice_rules=(ALLOCATOR,)),
)

_BY_NAME = {e.name: e for e in CATALOGUE}

# What an arm can inject into a script, in the order optimize tries them.
INJECTABLE: tuple[str, ...] = tuple(e.name for e in CATALOGUE if e.injectable)
# The order the injected recipes act on a root module, and the order of their code edits:
# the model's layout, the modules swapped in place, fuse_batch_norm over them, compile last.
INJECTION_ORDER: tuple[str, ...] = tuple(
    e.name for e in sorted((e for e in CATALOGUE if e.injected_at is not None), key=lambda e: e.injected_at or 0))
# advice rule -> the recipe that acts on it
RULE_RECIPES: dict[str, str] = dict(sorted((rule, e.name) for e in CATALOGUE for rule in e.advice_rules))


def reaches_script(name: str) -> bool:
    """Whether ``profilednn optimize -- <script>`` measures recipe ``name`` on a script:
    injected into it (``INJECTABLE``, read at each call: the set grows as recipes learn to
    reach a script), or set in the launch environment of the script's runs (a
    ``process_start`` recipe: threads, the allocator)."""
    known = find(name)
    return name in INJECTABLE or (known is not None and known.process_start)


def recipe_names() -> list[str]:
    """Every built-in recipe's name, in the order optimize tries them."""
    return [e.name for e in CATALOGUE]


def entry(name: str) -> RecipeEntry:
    """The catalogue line of recipe ``name`` (KeyError for a name not built in)."""
    return _BY_NAME[name]


def find(name: str) -> RecipeEntry | None:
    """The catalogue line of recipe ``name``, or None for a recipe of one's own."""
    return _BY_NAME.get(name)


__all__ = [
    "ALLOCATOR", "CATALOGUE", "CHANNELS_LAST", "DATALOADER_WORKERS", "DDP_BF16_ALLREDUCE", "DDP_BUCKET_SIZE",
    "DDP_BUCKET_VIEW", "DDP_STATIC_GRAPH", "DTYPE_POLICY", "FROZEN_BATCHNORM",
    "FROZEN_WEIGHT_GRADS", "FUSED_BATCHNORM", "FUSED_DROPOUT", "FUSED_LOSS", "FUSED_OPTIMIZER", "GateKind",
    "INJECTABLE", "INJECTION_ORDER", "POINTWISE_GEMM", "RULE_RECIPES", "RecipeEntry", "TORCH_COMPILE", "THREADS",
    "entry", "find", "reaches_script", "recipe_names",
]

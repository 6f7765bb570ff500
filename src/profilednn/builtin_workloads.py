"""The built-in workloads' names, importable without torch.

The CLI checks ``--model`` while it parses options, before the seconds that importing
torch and the zoo take; ``workloads.zoo`` holds the registry itself, and a test keeps the
two lists equal.
"""

from __future__ import annotations

from .errors import WorkloadError

BUILTIN_WORKLOADS: tuple[str, ...] = ("small_cnn", "resnet50", "resnext50_32x4d", "alexnet",
                                      "retinanet_resnext50_fpn", "bert_base", "lstm_lm")


def check_workload_name(name: str) -> str:
    """``name`` when it is a built-in workload, else a WorkloadError listing the choices."""
    if name not in BUILTIN_WORKLOADS:
        raise WorkloadError(f"unknown workload {name!r}; choose one of: {', '.join(BUILTIN_WORKLOADS)}")
    return name

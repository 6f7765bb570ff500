"""The workloads job's Python API: the built-in training workloads (``profilednn models``)."""

from __future__ import annotations

from .base import COMMON_KNOBS, WorkloadSpec
from .zoo import build_workload, get_spec, list_workloads

__all__ = ["COMMON_KNOBS", "WorkloadSpec", "build_workload", "get_spec", "list_workloads"]

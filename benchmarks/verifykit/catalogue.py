"""Every check ``verify`` knows: its part, the targets its rows report, what the host
needs for it, how long it takes on the slowest machine it has met, and its function.

The order is the run order: the peaks first (the checks after them read the cached
profile), then the rows this 2-core guest can never give (CUDA, many cores), then the
rest of the CPU rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module

from .host import MANY_CORES, Host
from .rows import Row


def _needs_cuda(host: Host) -> str | None:
    return None if host.cuda else "no CUDA"


def _needs_cores(host: Host) -> str | None:
    return None if host.cores >= MANY_CORES else f"{host.cores} cores (needs {MANY_CORES} or more)"


def _any(host: Host) -> str | None:
    return None


@dataclass(frozen=True)
class Check:
    """One check: ``run`` is ``package.module:function``, called as ``fn(host, quick)``."""

    name: str
    part: str
    targets: tuple[str, ...]
    needs: Callable[[Host], str | None]
    estimate_s: float  # on a 2-core guest (AMD EPYC Zen 3, the slowest met), full shapes
    quick_estimate_s: float
    run: str

    def function(self) -> Callable[[Host, bool], list[Row]]:
        module, fn = self.run.split(":")
        return getattr(import_module(module), fn)

    def estimate(self, quick: bool) -> float:
        return self.quick_estimate_s if quick else self.estimate_s

    def unmeasured(self, status: str, reason: str) -> list[Row]:
        """One row per target, none measured (``n/a``, ``skipped`` or ``error``)."""
        return [Row(self.part, self.name, t, status, reason=reason) for t in self.targets]


CHECKS = (
    Check("peaks", "any CPU", ("fp32 GEMM peak", "BF16 as the tier says", "STREAM triad"), _any, 15, 15,
          "verifykit.cpu_checks:peaks"),
    Check("footprint_gpu", "CUDA", ("predicted peak vs torch.cuda.max_memory_allocated",), _needs_cuda, 30, 20,
          "verifykit.cuda_checks:footprint_gpu"),
    Check("offload_gpu", "CUDA", ("offload: activation peak cut", "offload: slowdown"), _needs_cuda, 40, 25,
          "verifykit.cuda_checks:offload_gpu"),
    Check("pipeline_gpu", "CUDA", ("CPU/GPU pipeline vs GPU alone and CPU alone",), _needs_cuda, 60, 30,
          "verifykit.cuda_checks:pipeline_gpu"),
    Check("gpu_profile", "CUDA", ("a GPU training step profiled",), _needs_cuda, 5, 5, "verifykit.cuda_checks:gpu_profile"),
    Check("ranks_threads", "8+ cores", ("Table 3: every layout runs", "more ranks beat 1xN"), _needs_cores, 120, 60,
          "verifykit.core_checks:ranks_threads"),
    Check("weak_scaling", "8+ cores", ("weak-scaling efficiency",), _needs_cores, 60, 30, "verifykit.core_checks:weak_scaling"),
    Check("projection_all_cores", "8+ cores", ("own step projected", "2 -> all cores projection"), _needs_cores,
          60, 30, "verifykit.core_checks:projection_all_cores"),
    Check("optimize_convnet", "any CPU", ("total speedup", "BF16 per the tier", "final numerics"), _any, 125, 45,
          "verifykit.cpu_checks:optimize_convnet"),
    Check("optimize_transformer", "any CPU", ("total speedup", "BF16 per the tier", "final numerics"), _any, 95, 40,
          "verifykit.cpu_checks:optimize_transformer"),
    Check("projection", "any CPU", ("own step projected", "threads what-if"), _any, 150, 45, "verifykit.cpu_checks:projection"),
    Check("kernels", "any CPU", ("focal loss vs torch.compile", "LAMB vs its bandwidth bound"), _any, 45, 40,
          "verifykit.cpu_checks:kernels"),
)
BY_NAME = {c.name: c for c in CHECKS}

__all__ = ["BY_NAME", "CHECKS", "Check"]

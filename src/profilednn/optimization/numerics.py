"""The numerics check: the same seeded steps on two setups, losses and gradients compared.

Both arms start from the same weights (clones of one setup), see the same batches in
the same order after ``torch.manual_seed(seed)``, and run ``steps`` training steps.
Dropout is switched off while they run (``p = 0``) so that both compute the same function
even where a recipe changes how random numbers are drawn (torch.compile does). Compared:

- the loss of every step: largest relative difference;
- the gradients of the first step (same weights in both arms) of every parameter the
  optimizer updates, all together: relative L2 difference ||G_b - G_a|| / ||G_a||. Every
  updated parameter must have a finite gradient in both. The worst single parameter is
  reported too, but does not decide: a parameter whose gradient is tiny or zero in exact
  arithmetic (a bias right before a batch norm), or that sits behind a ReLU whose input is
  within rounding of zero, can differ by percents between two equally valid fp32 orders of
  summation (seen on a randomly initialised RetinaNet: a 1-ulp perturbation of the weights
  moved one layer's gradient by 1 %), while the gradient as a whole moves by 1e-5.

A recipe passes when both are within its ``Tolerance`` and nothing is NaN or infinite.

The tolerance is calibrated on the model: a randomly initialised deep network can be so
sensitive that rounding alone moves it (ResNet-50, batch 16: multiplying every weight by
1 + 2**-24 * N(0, 1), i.e. below fp32's resolution, moved the first-step gradient by 2.3 %
and the second step's loss by up to 1 %). ``rounding_noise`` measures that: the stock
setup against itself with weights perturbed at that level. ``optimize`` then allows each
recipe the larger of its stated tolerance and a multiple of this noise, and reports both.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from ..train_step import TrainStep
from .recipe_contract import Tolerance


@dataclass
class Trajectory:
    """What one arm did: the loss of each step, the first step's gradients, and how long
    the first step took (it includes compilation and one-time setup)."""

    losses: list[float]
    grads: dict[str, torch.Tensor] = field(repr=False)
    first_step_ms: float


@dataclass(frozen=True)
class NumericsResult:
    verdict: str  # "pass" | "fail"
    steps: int
    loss_max_rel_diff: float
    grad_rel_diff: float  # all updated parameters together (decides)
    worst_param: str | None
    worst_param_rel_diff: float  # the single worst parameter (reported)
    detail: str
    tolerance: Tolerance

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"


@contextlib.contextmanager
def dropout_off(model: nn.Module) -> Iterator[None]:
    """Set every dropout probability to 0 for the duration (restored afterwards)."""
    saved: list[tuple[nn.Module, str, float]] = []
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.p:
            saved.append((m, "p", m.p))
            m.p = 0.0
        elif isinstance(m, nn.MultiheadAttention) and m.dropout:
            saved.append((m, "dropout", m.dropout))
            m.dropout = 0.0
    try:
        yield
    finally:
        for m, attr, value in saved:
            setattr(m, attr, value)


def record_trajectory(setup: TrainStep, steps: int, seed: int, *, dropout: bool = False) -> Trajectory:
    """Run ``steps`` seeded training steps from the start of the data; keep the losses and
    the first step's gradients. Dropout is off unless ``dropout`` (then ``seed`` also draws
    its masks: the random-stream gate, ``stream_gate.py``)."""
    if steps < 1:
        raise ValueError(f"numerics steps must be >= 1, got {steps}")
    setup.rewind()
    torch.manual_seed(seed)
    losses: list[float] = []
    grads: dict[str, torch.Tensor] = {}
    first_ms = 0.0
    with contextlib.nullcontext() if dropout else dropout_off(setup.model):
        for k in range(steps):
            t0 = time.perf_counter()
            keep = (lambda: grads.update(setup.optimized_grads())) if k == 0 else None
            losses.append(setup.run(before_update=keep).loss)
            if k == 0:
                first_ms = (time.perf_counter() - t0) * 1000.0
    setup.rewind()
    return Trajectory(losses=losses, grads=grads, first_step_ms=first_ms)


PERTURBATION = 2.0**-24  # relative size of the weight perturbation: half an fp32 ulp


def perturb_weights(setup: TrainStep, seed: int, relative: float = PERTURBATION) -> None:
    """Multiply every floating parameter by (1 + relative * N(0, 1)), in place, seeded."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in setup.model.parameters():
            if p.is_floating_point():
                noise = torch.randn(p.shape, generator=generator, dtype=torch.float32).to(p.dtype)
                p.mul_(noise.mul_(relative).add_(1.0))


def rounding_noise(setup: TrainStep, reference: Trajectory, steps: int, seed: int) -> "NumericsResult":
    """How far the stock setup moves from its own trajectory when its weights change at
    the level of fp32 rounding (``setup`` is perturbed and trained: pass a clone)."""
    perturb_weights(setup, seed + 1)
    return compare_trajectories(reference, record_trajectory(setup, steps, seed), Tolerance(math.inf, math.inf))


def calibrated(tolerance: Tolerance, noise: "NumericsResult | None", factor: float) -> Tolerance:
    """``tolerance`` widened to ``factor`` times the measured rounding noise where that is larger."""
    if noise is None:
        return tolerance
    return Tolerance(
        loss_rtol=max(tolerance.loss_rtol, factor * noise.loss_max_rel_diff),
        grad_rtol=max(tolerance.grad_rtol, factor * noise.grad_rel_diff),
    )


def _rel(diff: float, ref: float) -> float:
    return diff / ref if ref > 0 else diff


def compare_trajectories(ref: Trajectory, cand: Trajectory, tolerance: Tolerance) -> NumericsResult:
    """Judge ``cand`` against ``ref`` within ``tolerance``."""
    steps = min(len(ref.losses), len(cand.losses))
    problems: list[str] = []
    loss_rel = 0.0
    for k in range(steps):
        a, b = ref.losses[k], cand.losses[k]
        if not math.isfinite(b) and math.isfinite(a):
            problems.append(f"loss of step {k + 1} is {b}")
            loss_rel = math.inf
            continue
        loss_rel = max(loss_rel, _rel(abs(b - a), abs(a)))
    worst, worst_rel = None, 0.0
    diff_sq = ref_sq = 0.0
    for name, g_ref in ref.grads.items():
        g = cand.grads.get(name)
        if g is None:
            problems.append(f"no gradient for {name}")
            continue
        if g.numel() != g_ref.numel():
            problems.append(f"gradient of {name} has {g.numel()} values, expected {g_ref.numel()}")
            continue
        g, g_ref = g.reshape(-1).double(), g_ref.reshape(-1).double()
        if not bool(torch.isfinite(g).all()):
            problems.append(f"gradient of {name} is not finite")
            continue
        d = float(torch.linalg.vector_norm(g - g_ref))
        r = float(torch.linalg.vector_norm(g_ref))
        diff_sq += d * d
        ref_sq += r * r
        if _rel(d, r) > worst_rel:
            worst, worst_rel = name, _rel(d, r)
    grad_rel = math.inf if problems and any("gradient" in p for p in problems) else _rel(
        math.sqrt(diff_sq), math.sqrt(ref_sq))
    ok = not problems and loss_rel <= tolerance.loss_rtol and grad_rel <= tolerance.grad_rtol
    figures = f"loss max rel diff {loss_rel:.2e} over {steps} steps" + (
        "" if not ref.grads else f", gradient rel L2 diff {grad_rel:.2e}"
        + (f" (worst parameter {worst}: {worst_rel:.2e})" if worst else ""))
    if ok:
        detail = f"{figures}: within {tolerance.describe()}"
    else:
        over = []
        if loss_rel > tolerance.loss_rtol:
            over.append(f"loss {loss_rel:.2e} > {tolerance.loss_rtol:g}")
        if grad_rel > tolerance.grad_rtol:
            over.append(f"gradients {grad_rel:.2e} > {tolerance.grad_rtol:g}")
        detail = "; ".join(problems + over) + f" ({figures})"
    return NumericsResult(
        verdict="pass" if ok else "fail",
        steps=steps,
        loss_max_rel_diff=loss_rel,
        grad_rel_diff=grad_rel,
        worst_param=worst,
        worst_param_rel_diff=worst_rel,
        detail=detail,
        tolerance=tolerance,
    )


__all__ = [
    "NumericsResult",
    "Trajectory",
    "calibrated",
    "compare_trajectories",
    "dropout_off",
    "perturb_weights",
    "record_trajectory",
    "rounding_noise",
]

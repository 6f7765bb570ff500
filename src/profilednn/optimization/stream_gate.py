"""The gate for recipes that change the random stream (``random_stream = True``:
``fused_dropout`` draws its masks from Philox instead of torch's generator).

The usual gates run with dropout off (``numerics.dropout_off``), so they cannot see a
dropout that is wrong: a kernel that forgot the 1 / (1 - p) scale computes the identity
with p = 0 like a right one. With dropout on, the masks differ from the arm's by design, so
nothing is bit-comparable, and the whole model's loss is a weak witness: a post-LayerNorm
transformer at initialisation hardly depends on the dropout scale (bert_base scaled down:
a missing scale moved the loss by 2.5e-3, as much as another dropout seed did). So the
gate asks two questions, with dropout on:

1. **Every dropout site is a dropout** (one seeded training step of the candidate, hooks on
   every dropout module with p > 0): the share of kept elements is 1 - p within ``z``
   binomial standard deviations; the gain sum(y x) / sum(x^2) -- 1 for
   ``y = x mask / (1 - p)`` -- is 1 within ``z`` of its standard deviation
   sqrt(p / (1 - p) sum x^4) / sum x^2 (plus the values' rounding); and the backward uses the
   forward's mask: ``dx x = dy y`` elementwise (on the first elements of each site).
   A missing scale moves the gain by p: dozens of standard deviations at any real size.
2. **It trains as the arm does** (over the gate's steps): the candidate's loss trajectory
   against the arm's at the same seed, within max(stated loss tolerance, ``factor`` x the
   arm's own spread between two dropout seeds). Different masks are as far apart as that.

The usual gate (dropout off) still decides whether the rest of the arithmetic is the arm's.
A user's script cannot turn its dropout off: there (``script/search.py``) the sites are
observed in the candidate's own run and the arm's spread is its trajectory with the random
stream reseeded at the model's first call; ``stream_verdict`` judges both paths' figures.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import torch
from torch import nn

from ..train_step import TrainStep
from .numerics import NumericsResult, Trajectory, compare_trajectories, record_trajectory
from .precision_gate import NOISE_FLOOR_MIN, GateSettings
from .recipe_contract import Tolerance

BACKWARD_SAMPLE = 65536  # elements per site whose gradients are kept for the mask check
# relative rounding of the values (the gain's and the backward identity's allowance)
RESOLUTION = {torch.float32: 2.0**-20, torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}


@dataclass
class FreshSetups:
    """Builders of the two setups the gate runs with dropout on, each fresh from the stock
    weights: the arm (stock + accepted recipes) and the candidate (+ the recipe)."""

    arm: Callable[[], TrainStep]
    candidate: Callable[[], TrainStep]


@dataclass
class Site:
    """What one dropout call did: elements seen, kept share, gain, their standard deviations,
    and (after backward) the relative error of ``dx x = dy y``."""

    name: str
    p: float
    n: int = 0
    kept: float = math.nan
    kept_sd: float = math.nan
    gain: float = math.nan
    gain_sd: float = math.nan
    resolution: float = 0.0
    backward_rel: float | None = None
    _x: torch.Tensor | None = field(default=None, repr=False)
    _y: torch.Tensor | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """The figures as plain data (they cross a process boundary in a script's arm)."""
        return {k: v for k, v in asdict(self).items() if not k.startswith("_")}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Site":
        return cls(**{k: v for k, v in d.items() if k in SITE_FIELDS})

    def problems(self, z: float) -> list[str]:
        """Why this site is not a dropout of probability ``p`` (empty when it is)."""
        out = []
        if self.n == 0:
            return out
        if not math.isfinite(self.kept) or abs(self.kept - (1.0 - self.p)) > z * self.kept_sd + 1.0 / self.n:
            out.append(f"{self.name}: kept {self.kept:.4f} of {self.n}, expected {1.0 - self.p:.4f} "
                       f"+- {z:g} x {self.kept_sd:.1e}")
        if not math.isfinite(self.gain) or abs(self.gain - 1.0) > z * self.gain_sd + self.resolution:
            out.append(f"{self.name}: gain sum(y x)/sum(x^2) {self.gain:.4f}, expected 1 +- {z:g} x "
                       f"{self.gain_sd:.1e} (a dropout scales what it keeps by 1/(1-p))")
        if self.backward_rel is None:
            out.append(f"{self.name}: no gradient reached it")
        elif not self.backward_rel <= 4.0 * self.resolution + 1e-6:
            out.append(f"{self.name}: backward does not use the forward's mask (|dx x - dy y| / |dy y| = "
                       f"{self.backward_rel:.2e})")
        return out


SITE_FIELDS = frozenset(f.name for f in fields(Site) if not f.name.startswith("_"))


def observe_forward(site: Site, x: torch.Tensor, y: torch.Tensor) -> None:
    """Fill ``site``'s forward figures from one call: input ``x``, output ``y``."""
    xd, yd = x.detach().reshape(-1), y.detach().reshape(-1)
    ok = torch.isfinite(xd) & (xd != 0)
    xs, ys = xd[ok].double(), yd[ok].double()
    n = int(xs.numel())
    site.n = n
    site.resolution = RESOLUTION.get(x.dtype, 2.0**-20)
    if n == 0:
        return
    p = site.p
    site.kept = float((ys != 0).double().mean())
    site.kept_sd = math.sqrt(p * (1.0 - p) / n)
    x2 = xs * xs
    s2 = float(x2.sum())
    site.gain = float((ys * xs).sum()) / s2
    site.gain_sd = math.sqrt(p / (1.0 - p) * float((x2 * x2).sum())) / s2
    site._x, site._y = xd[:BACKWARD_SAMPLE].float(), yd[:BACKWARD_SAMPLE].float()


def observe_backward(site: Site, grad_x: torch.Tensor | None, grad_y: torch.Tensor | None) -> None:
    """Fill ``site``'s backward figure (does dx x = dy y hold?) from that call's gradients."""
    if grad_x is None or grad_y is None or site._x is None or site._y is None:
        return
    gx = grad_x.detach().reshape(-1)[:BACKWARD_SAMPLE].float()
    gy = grad_y.detach().reshape(-1)[:BACKWARD_SAMPLE].float()
    ref = gy * site._y
    scale = float(torch.linalg.vector_norm(ref))
    diff = float(torch.linalg.vector_norm(gx * site._x - ref))
    site.backward_rel = diff / scale if scale > 0 else diff


class _Tap(torch.autograd.Function):
    """Identity (a copy) whose backward hands the incoming gradient to ``sink``."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, sink: Callable[[torch.Tensor], None]) -> torch.Tensor:
        ctx.sink = sink
        return t.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.sink(grad)
        return grad, None


def observe_first_call(module: nn.Module, site: Site) -> list[Any]:
    """Hooks that fill ``site`` from ``module``'s first call in training with a gradient to
    its input (at the p it ran with) and from that same call's backward: the call's input and
    output pass through taps, so a module called several times a step (one dropout module
    shared by many layers) is paired with its own gradients. The caller removes the handles."""
    state: dict[str, Any] = {"armed": True, "grads": {}}

    def sink(key: str) -> Callable[[torch.Tensor], None]:
        def keep(grad: torch.Tensor) -> None:
            grads = state["grads"]
            grads[key] = grad
            if "dx" in grads and "dy" in grads:
                observe_backward(site, grads.pop("dx"), grads.pop("dy"))
        return keep

    def pre(mod: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        x = args[0] if args else None
        if not (state["armed"] and mod.training and torch.is_grad_enabled() and isinstance(x, torch.Tensor)
                and x.requires_grad):
            return None
        state["armed"], state["tapped"] = False, True
        return (_Tap.apply(x, sink("dx")), *args[1:])

    def post(mod: nn.Module, args: tuple[Any, ...], out: Any) -> Any:
        if not state.pop("tapped", False) or not isinstance(out, torch.Tensor):
            return None
        site.p = float(getattr(mod, "p", site.p))
        observe_forward(site, args[0], out)
        return _Tap.apply(out, sink("dy"))

    return [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]


def dropout_sites(setup: TrainStep, seed: int) -> list[Site]:
    """One seeded training step of ``setup`` with dropout on, every dropout module with p > 0
    observed (forward statistics and the backward's mask, ``observe_first_call``)."""
    sites: list[Site] = []
    handles = []
    for name, module in setup.model.named_modules():
        if isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0.0 and module.training:
            site = Site(name or type(module).__name__, float(module.p))
            sites.append(site)
            handles += observe_first_call(module, site)
    try:
        setup.rewind()
        torch.manual_seed(seed)
        setup.run()
    finally:
        for h in handles:
            h.remove()
        setup.rewind()
    return [s for s in sites if s.n > 0]


def stream_gate(fresh: FreshSetups, steps: int, stated: Tolerance, gate: GateSettings) -> NumericsResult:
    """The random-stream gate (see the module doc): dropout sites, then the trajectory."""
    sites = dropout_sites(fresh.candidate(), gate.seed)
    arm_a = record_trajectory(fresh.arm(), steps, gate.seed, dropout=True)
    arm_b = record_trajectory(fresh.arm(), steps, gate.seed + 1, dropout=True)
    candidate = record_trajectory(fresh.candidate(), steps, gate.seed, dropout=True)
    return stream_verdict(sites, arm_a, arm_b, candidate, stated, gate, "between two dropout seeds")


def within_spread(arm: Trajectory, arm_other: Trajectory, candidate: Trajectory, stated_rtol: float,
                  factor: float) -> tuple[NumericsResult, float, float]:
    """(``candidate``'s loss trajectory against ``arm``'s, allowed, spread): allowed is
    max(``stated_rtol``, ``factor`` x the spread between ``arm`` and ``arm_other``, the arm
    under another random stream, floored at ``NOISE_FLOOR_MIN``). The bound of the
    random-stream gate and of a script's accepted recipes together that draw other masks."""
    spread = compare_trajectories(arm, arm_other, Tolerance(math.inf, math.inf)).loss_max_rel_diff
    allowed = max(stated_rtol, factor * max(spread, NOISE_FLOOR_MIN))
    return compare_trajectories(arm, candidate, Tolerance(allowed, math.inf)), allowed, spread


def stream_verdict(sites: list[Site], arm: Trajectory, arm_other: Trajectory, candidate: Trajectory,
                   stated: Tolerance, gate: GateSettings, spread_what: str) -> NumericsResult:
    """Every observed site a dropout of its p (``Site.problems``), and ``candidate``'s loss
    trajectory within max(stated, factor x the spread between ``arm`` and ``arm_other``, the
    arm under another random stream, ``spread_what`` saying how)."""
    observed = [s for s in sites if s.n > 0]
    problems = [text for s in observed for text in s.problems(gate.stream_z)]
    worst = max(observed, key=lambda s: abs(s.gain - 1.0) / max(s.gain_sd, 1e-30), default=None)
    site_text = (f"{len(observed)} dropout sites checked (keep rate, gain, backward mask; worst gain "
                 f"{worst.gain:.4f} at {worst.name})" if worst else "no dropout site ran with p > 0")
    raw, allowed, spread = within_spread(arm, arm_other, candidate, stated.loss_rtol, gate.factor)
    figures = (f"with dropout on, loss trajectory over {raw.steps} steps: max rel diff {raw.loss_max_rel_diff:.2e} "
               f"(allowed {allowed:.2e} = max(stated {stated.loss_rtol:g}, {gate.factor:g} x the arm's spread "
               f"{spread_what} {spread:.2e}))")
    if not observed:
        problems.append("no dropout site ran: the recipe's masks were not exercised")
    if not (math.isfinite(raw.loss_max_rel_diff) and raw.loss_max_rel_diff <= allowed):
        problems.append(f"trains differently: {figures}")
    verdict = "fail" if problems else "pass"
    shown = problems[:3] + ([f"and {len(problems) - 3} more"] if len(problems) > 3 else [])
    detail = (f"random stream: {'; '.join(shown)}" if problems
              else f"random stream: a dropout at every site: {site_text}; {figures}")
    return replace(raw, verdict=verdict, detail=detail)


__all__ = ["FreshSetups", "SITE_FIELDS", "Site", "dropout_sites", "observe_backward", "observe_first_call",
           "observe_forward", "stream_gate", "stream_verdict", "within_spread"]

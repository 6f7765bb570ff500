"""LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning: Training BERT in
76 minutes", Algorithm 2), twice: a plain per-parameter reference and a multi-tensor one.

For each parameter x with gradient g at step t (phi is the identity):

    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g**2
    r = (m / (1 - beta1**t)) / (sqrt(v / (1 - beta2**t)) + eps)
    u = r + weight_decay * x
    trust = ||x|| / ||u||   (1 when either norm is 0)
    x = x - lr * trust * u

``ReferenceLAMB`` writes that down one parameter at a time, each line a tensor op, as a
reader of the paper would: about 30 passes over memory per parameter, several of them into
freshly allocated temporaries.

``FusedLAMB`` computes the same update in one of two ways:

- ``native`` (the default where a C compiler is present): the hand-written kernel in
  ``kernels/lamb.c``. Per tensor, one pass updates m and v and accumulates ||x||^2 and
  ||u||^2; a second pass recomputes u and applies the step while the tensor is in cache.
- ``foreach``: PyTorch's multi-tensor kernels on cache-sized chunks of whole parameters:
  the fused Adam kernel (``torch._fused_adam_``, lr = -1 on a zeroed scratch buffer) updates
  m and v and writes r in one pass, then ``+ weight_decay * x``, the norms and the step
  follow while the chunk is in cache.

Either way main memory sees g, m, v, x read and m, v, x written: 7 streams instead of about
30, with no per-step temporaries; a parameter bigger than the cache costs 3 more streams.
"""

from __future__ import annotations

import ctypes
import warnings
from collections.abc import Iterable
from typing import Any, Callable

import torch

from .bindings import lamb_kernel
from .build import NativeKernelUnavailable

# Elements per chunk of small parameters: 1 Mi fp32 = 4 MiB for each of the five tensor
# roles (x, g, m, v, u), so a chunk stays in a server's L3 between its multi-tensor ops.
BLOCK_ELEMENTS = 1 << 20

# "native": the hand-written fused kernel (kernels/lamb.c); "foreach": PyTorch's
# multi-tensor kernels; "auto": native where it applies and builds, else foreach.
BACKENDS = ("auto", "native", "foreach")


def _check_hyperparameters(lr: float, betas: tuple[float, float], eps: float, weight_decay: float) -> None:
    if not lr >= 0.0:
        raise ValueError(f"invalid learning rate: {lr}")
    if not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0:
        raise ValueError(f"invalid betas: {betas} (each must be in [0, 1))")
    if not eps > 0.0:
        raise ValueError(f"invalid eps: {eps} (must be > 0)")
    if not weight_decay >= 0.0:
        raise ValueError(f"invalid weight_decay: {weight_decay}")


def _init_state(state: dict[str, Any], p: torch.Tensor) -> None:
    """Adam's state for a parameter seen for the first time: step 0, zero moments."""
    if not state:
        state["step"] = 0
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


class ReferenceLAMB(torch.optim.Optimizer):
    """LAMB exactly as the paper writes it, one parameter and one tensor op at a time.

    The yardstick for ``FusedLAMB`` (tests compare them to 1e-6, the benchmark times them).
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
    ) -> None:
        _check_hyperparameters(lr, betas, eps, weight_decay)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                state = self.state[p]
                _init_state(state, p)
                state["step"] += 1
                t = state["step"]
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(g, alpha=1.0 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
                m_hat = m / (1.0 - beta1**t)
                v_hat = v / (1.0 - beta2**t)
                r = m_hat / (v_hat.sqrt() + group["eps"])
                u = r + group["weight_decay"] * p
                w_norm = torch.linalg.vector_norm(p)
                u_norm = torch.linalg.vector_norm(u)
                trust = (w_norm / u_norm).item() if w_norm > 0 and u_norm > 0 else 1.0
                p.add_(u, alpha=-group["lr"] * trust)
        return loss


class FusedLAMB(torch.optim.Optimizer):
    """LAMB in about 7 passes over memory per step instead of about 30: the same update as
    ``ReferenceLAMB`` (to float rounding), by the native fused kernel or by multi-tensor
    kernels (``backend``: "auto" takes native for fp32 CPU parameters where it builds, else
    foreach, with a warning when the kernel cannot be built; "native" never falls back).

    ``params`` and the hyperparameters are those of ``torch.optim.Adam``; parameter groups
    may set their own ``weight_decay`` (e.g. 0 for biases and norms). Sparse gradients
    are not supported. ``block_elements`` bounds the elements of a chunk of small parameters
    (a bigger parameter is a chunk of its own); the default keeps a chunk's five tensor roles
    (x, g, m, v, u) within a few MiB of cache. The state holds ``step``, ``exp_avg`` and
    ``exp_avg_sq``, as Adam's does.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        *,
        block_elements: int = BLOCK_ELEMENTS,
        backend: str = "auto",
    ) -> None:
        _check_hyperparameters(lr, betas, eps, weight_decay)
        if block_elements < 1:
            raise ValueError(f"block_elements must be >= 1, got {block_elements}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.block_elements = int(block_elements)
        self.backend = backend
        self.backend_used: str | None = None  # the path the last step took: "native" or "foreach"
        self._scratch: torch.Tensor | None = None
        self._native_error: str | None = None

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for key, default in (("block_elements", BLOCK_ELEMENTS), ("backend", "auto"), ("backend_used", None),
                             ("_scratch", None), ("_native_error", None)):
            self.__dict__.setdefault(key, default)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            if any(p.grad.is_sparse for p in params):
                raise RuntimeError("FusedLAMB does not support sparse gradients")
            by_step: dict[tuple[int, torch.dtype, torch.device], list[torch.Tensor]] = {}
            for p in params:
                if not _is_dense(p):
                    raise RuntimeError(f"FusedLAMB needs dense parameters; got one of shape {tuple(p.shape)} "
                                       f"and strides {p.stride()}")
                state = self.state[p]
                _init_state(state, p)
                for key in ("exp_avg", "exp_avg_sq"):  # the kernels need x's layout in m and v
                    if state[key].stride() != p.stride():
                        state[key] = _laid_out_like(state[key], p)
                state["step"] += 1
                by_step.setdefault((state["step"], p.dtype, p.device), []).append(p)
            # Normally one bucket; parameters added to a group later have their own step count.
            for (t, dtype, device), bucket in by_step.items():
                if self._native_applies(dtype, device):
                    self._update_native(bucket, t, group)
                    self.backend_used = "native"
                else:
                    self._update(bucket, t, group)
                    self.backend_used = "foreach"
        return loss

    def _native_applies(self, dtype: torch.dtype, device: torch.device) -> bool:
        """Whether this bucket takes the hand-written kernel (fp32 on the CPU, kernel built)."""
        if self.backend == "foreach":
            return False
        if dtype != torch.float32 or device.type != "cpu":
            if self.backend == "native":
                raise RuntimeError(f"FusedLAMB(backend='native') handles fp32 CPU parameters; got {dtype} on "
                                   f"{device} (use backend='auto' or 'foreach')")
            return False
        if self._native_error is not None:
            return False
        try:
            lamb_kernel()
        except NativeKernelUnavailable as exc:
            if self.backend == "native":
                raise
            self._native_error = str(exc)
            warnings.warn(f"FusedLAMB: the native kernel is unavailable ({exc}); using the multi-tensor path, "
                          "about 1.5-2x slower", RuntimeWarning, stacklevel=3)
            return False
        return True

    def _update_native(self, params: list[torch.Tensor], t: int, group: dict[str, Any]) -> None:
        beta1, beta2 = group["betas"]
        grads = [_laid_out_like(p.grad, p) for p in params]  # kept alive through the call
        n = len(params)
        pointers = ctypes.c_void_p * n

        def addresses(tensors: list[torch.Tensor]) -> Any:
            return pointers(*[x.data_ptr() for x in tensors])

        lamb_kernel().profilednn_lamb_step_f32(
            n, addresses(params), addresses(grads), addresses([self.state[p]["exp_avg"] for p in params]),
            addresses([self.state[p]["exp_avg_sq"] for p in params]),
            (ctypes.c_int64 * n)(*[p.numel() for p in params]),
            beta1, beta2, 1.0 - beta1, 1.0 - beta2, 1.0 - beta1**t, 1.0 - beta2**t, group["eps"], group["weight_decay"], group["lr"],
            torch.get_num_threads(),
        )

    def _chunks(self, params: list[torch.Tensor]) -> list[list[torch.Tensor]]:
        """Consecutive parameters, at most ``block_elements`` elements per chunk unless one
        parameter alone is bigger."""
        chunks: list[list[torch.Tensor]] = []
        current: list[torch.Tensor] = []
        filled = 0
        for p in params:
            if current and filled + p.numel() > self.block_elements:
                chunks.append(current)
                current, filled = [], 0
            current.append(p)
            filled += p.numel()
        if current:
            chunks.append(current)
        return chunks

    def _directions(self, chunk: list[torch.Tensor]) -> list[torch.Tensor]:
        """Views of the scratch buffer shaped and strided like the chunk's parameters."""
        need = sum(p.numel() for p in chunk)
        p0 = chunk[0]
        scratch = self._scratch
        if scratch is None or scratch.numel() < need or scratch.dtype != p0.dtype or scratch.device != p0.device:
            scratch = self._scratch = torch.empty(need, dtype=p0.dtype, device=p0.device)
        out, offset = [], 0
        for p in chunk:
            out.append(scratch.as_strided(p.shape, p.stride(), offset))
            offset += p.numel()
        return out

    def _update(self, params: list[torch.Tensor], t: int, group: dict[str, Any]) -> None:
        beta1, beta2 = group["betas"]
        lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
        step = torch.tensor(float(t), dtype=torch.float32)
        for xs in self._chunks(params):
            us = self._directions(xs)
            # u = r (m and v updated in the same pass, by PyTorch's fused Adam kernel run
            # with lr = -1 on a zeroed buffer: 0 - (-1) * r), then u += weight_decay * x.
            torch._foreach_zero_(us)
            torch._fused_adam_(
                us, [_laid_out_like(x.grad, x) for x in xs], [self.state[x]["exp_avg"] for x in xs],
                [self.state[x]["exp_avg_sq"] for x in xs], [], [step] * len(xs),
                lr=-1.0, beta1=beta1, beta2=beta2, weight_decay=0.0, eps=eps, amsgrad=False, maximize=False,
            )
            if weight_decay != 0.0:
                torch._foreach_add_(us, xs, alpha=weight_decay)
            # Trust ratios ||x|| / ||u|| (1 where either is 0), then x -= lr * ratio * u.
            w_norm = torch.stack(torch._foreach_norm(xs))
            u_norm = torch.stack(torch._foreach_norm(us))
            ratio = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
            torch._foreach_mul_(us, (ratio * -lr).tolist())
            torch._foreach_add_(xs, us)


def _laid_out_like(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``t`` itself when it has ``like``'s strides, else a copy of it in ``like``'s layout
    (the multi-tensor kernels walk all their tensors in one flat order)."""
    if t.stride() == like.stride():
        return t
    return torch.empty_like(like).copy_(t)


def _is_dense(t: torch.Tensor) -> bool:
    """True when ``t`` covers exactly ``numel`` contiguous elements in some dimension order
    (row-major, channels-last, any permutation), so a flat buffer can be viewed like it."""
    if t.numel() <= 1:
        return True
    expected = 1
    for stride, size in sorted((st, s) for s, st in zip(t.shape, t.stride()) if s != 1):
        if stride != expected:
            return False
        expected *= size
    return True


__all__ = ["BLOCK_ELEMENTS", "FusedLAMB", "ReferenceLAMB"]

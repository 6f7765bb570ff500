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

``FusedLAMB`` computes the same update with multi-tensor kernels in two sweeps:

1. walking all parameters of a group in cache-sized blocks (slices of big tensors, groups
   of small ones): PyTorch's fused Adam kernel (``torch._fused_adam_``, lr = -1 on a zeroed
   buffer) updates m and v in place and writes r = m_hat / (sqrt(v_hat) + eps) in the same
   pass; ``+ weight_decay * x`` and the squared norms of x and u follow while the block is
   still in cache;
2. the trust ratios of all parameters at once, then x += (-lr * ratio) * u per parameter.

Memory sees g, m, v, x read and m, v, u written in sweep 1, and u, x read and x written in
sweep 2: 10 streams instead of about 30, no temporaries after the first step (u lives in
a persistent buffer, one parameter-sized copy per group), and a few dispatches per block
instead of a dozen per parameter.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Callable

import torch

# Elements per block and tensor role (grad, param, two moments, direction): 256 Ki fp32 =
# 1 MiB each, so a block's working set stays in cache between its multi-tensor ops.
BLOCK_ELEMENTS = 1 << 18


def _check_hyperparameters(lr: float, betas: tuple[float, float], eps: float, weight_decay: float) -> None:
    if not lr >= 0.0:
        raise ValueError(f"invalid learning rate: {lr}")
    if not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0:
        raise ValueError(f"invalid betas: {betas} (each must be in [0, 1))")
    if not eps > 0.0:
        raise ValueError(f"invalid eps: {eps} (must be > 0)")
    if not weight_decay >= 0.0:
        raise ValueError(f"invalid weight_decay: {weight_decay}")


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
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
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
    """LAMB with multi-tensor kernels (PyTorch's fused Adam kernel and ``torch._foreach_*``),
    walked in cache-sized blocks: the same update as ``ReferenceLAMB`` (to float rounding)
    in about 10 passes over memory per step instead of about 30.

    ``params`` and the hyperparameters are those of ``torch.optim.Adam``; parameter groups
    may set their own ``weight_decay`` (e.g. 0 for biases and norms). Sparse gradients
    are not supported. ``block_elements`` sets the block size (elements per tensor role).
    The state holds, besides ``step``, ``exp_avg`` and ``exp_avg_sq``, a ``direction``
    buffer of the parameter's size (the update direction u).
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
    ) -> None:
        _check_hyperparameters(lr, betas, eps, weight_decay)
        if block_elements < 1:
            raise ValueError(f"block_elements must be >= 1, got {block_elements}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.block_elements = int(block_elements)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.__dict__.setdefault("block_elements", BLOCK_ELEMENTS)

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
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                by_step.setdefault((state["step"], p.dtype, p.device), []).append(p)
            # Normally one bucket; parameters added to a group later have their own step count.
            for (t, _, _), bucket in by_step.items():
                self._update(bucket, t, group)
        return loss

    def _blocks(self, params: list[torch.Tensor]) -> list[list[tuple[int, int, int]]]:
        """Cut the flattened parameters into blocks of at most ``block_elements`` elements:
        a block is a list of (parameter index, start, stop); small tensors share a block."""
        size = self.block_elements
        blocks: list[list[tuple[int, int, int]]] = []
        current: list[tuple[int, int, int]] = []
        filled = 0
        for i, p in enumerate(params):
            n, start = p.numel(), 0
            while start < n:
                take = min(n - start, size - filled)
                current.append((i, start, start + take))
                start += take
                filled += take
                if filled == size:
                    blocks.append(current)
                    current, filled = [], 0
        if current:
            blocks.append(current)
        return blocks

    def _directions(self, params: list[torch.Tensor]) -> list[torch.Tensor]:
        """The persistent update-direction buffer of each parameter (flat, same size)."""
        out = []
        for p in params:
            state = self.state[p]
            buf = state.get("direction")
            if buf is None or buf.numel() != p.numel() or buf.dtype != p.dtype or buf.device != p.device:
                buf = torch.empty(p.numel(), dtype=p.dtype, device=p.device)
                state["direction"] = buf
            out.append(buf)
        return out

    def _update(self, params: list[torch.Tensor], t: int, group: dict[str, Any]) -> None:
        beta1, beta2 = group["betas"]
        lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]

        def flat(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
            return [x.view(-1) if x.is_contiguous() else x.reshape(-1) for x in tensors]

        xs = flat(params)
        gs = flat([p.grad for p in params])
        ms = flat([self.state[p]["exp_avg"] for p in params])
        vs = flat([self.state[p]["exp_avg_sq"] for p in params])
        for flat_list, role in ((xs, "parameters"), (ms, "exp_avg"), (vs, "exp_avg_sq")):
            if any(f.data_ptr() != q.data_ptr() for f, q in zip(flat_list, (
                    params if role == "parameters" else [self.state[p][role] for p in params]))):
                raise RuntimeError(f"FusedLAMB needs {role} in a dense (contiguous) layout")
        us = self._directions(params)
        step = torch.tensor(float(t), dtype=torch.float32)

        # Sweep 1, block by block: u = r (m and v updated in the same pass, by PyTorch's fused
        # Adam kernel run with lr = -1 on a zeroed buffer: 0 - (-1) * r), u += weight_decay * x,
        # and the squared norms of x and u per parameter.
        w_sq = torch.zeros(len(params), dtype=torch.float64)
        u_sq = torch.zeros(len(params), dtype=torch.float64)
        for block in self._blocks(params):
            x = [xs[i][a:b] for i, a, b in block]
            u = [us[i][a:b] for i, a, b in block]
            torch._foreach_zero_(u)
            torch._fused_adam_(
                u, [gs[i][a:b] for i, a, b in block], [ms[i][a:b] for i, a, b in block],
                [vs[i][a:b] for i, a, b in block], [], [step] * len(block),
                lr=-1.0, beta1=beta1, beta2=beta2, weight_decay=0.0, eps=eps, amsgrad=False, maximize=False,
            )
            if weight_decay != 0.0:
                torch._foreach_add_(u, x, alpha=weight_decay)
            index = torch.tensor([i for i, _, _ in block])
            w_sq.index_add_(0, index, torch.stack(torch._foreach_norm(x)).double().square())
            u_sq.index_add_(0, index, torch.stack(torch._foreach_norm(u)).double().square())
        # Trust ratios for every tensor at once, then sweep 2: x -= lr * ratio * u.
        w_norm, u_norm = w_sq.sqrt(), u_sq.sqrt()
        ratio = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
        for x, u, scale in zip(xs, us, (ratio * -lr).tolist()):
            x.add_(u, alpha=scale)


__all__ = ["BLOCK_ELEMENTS", "FusedLAMB", "ReferenceLAMB"]

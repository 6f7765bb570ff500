"""Sigmoid focal loss, torchvision's signature and values, with two implementations.

Same signature and values as ``torchvision.ops.sigmoid_focal_loss`` (Lin et al. 2017):

    p    = sigmoid(x)
    ce   = max(x, 0) - x*y + log(1 + exp(-|x|))   (binary cross-entropy with logits)
    m    = 1 - p_t = p + y - 2*p*y                 (p_t = p*y + (1-p)*(1-y))
    a_t  = alpha*y + (1-alpha)*(1-y)               (1 when alpha < 0)
    FL   = a_t * ce * m**gamma

Derivatives (derived by hand; seed 000's appendix 6 gives the binary-target form), with
dp/dx = p(1-p), dce/dx = p - y, dm/dx = p(1-p)(1-2y):

    dFL/dx = a_t * [ (p - y) * m**gamma + gamma * ce * p(1-p)(1-2y) * m**(gamma-1) ]
    dFL/dy = (2*alpha - 1) * ce * m**gamma - a_t * x * m**gamma
             + gamma * a_t * ce * (1 - 2p) * m**(gamma-1)     ((2*alpha-1) -> 0 when alpha < 0)

``native`` (the default where it applies: fp32 or bf16 logits on the CPU, targets without
a gradient): the C kernel in ``focal_loss.c``, built once per machine for the CPU's ISA
(``kernels/build.py``). When the logits need a gradient, ONE vectorised, threaded pass
reads x and y and writes both the loss (or only its block sums) and dFL/dx; backward then
only scales that gradient by the incoming one (nothing when it is 1). Memory sees the
three compulsory streams (x, y, gradient) instead of torchvision's ~35 elementwise passes.
The gradient's buffer is recycled once autograd and the user have dropped it
(``kernels/buffers.py``): a fresh one would be page-faulted in on every step.

``torch`` (the portable fallback: no compiler, float64/fp16, a gradient for the targets):
stock PyTorch ops walked in blocks that fit the last-level cache, so memory sees one read
of ``inputs`` and ``targets`` in the forward and one read of each plus one write of the
gradient in the backward (the block quantities are recomputed), and ``reduction="sum"/"mean"``
never materialises the per-element loss.

Large |logits| are safe in both: ``softplus`` never overflows, ``sigmoid`` saturates to
exactly 0 or 1, and no log of a probability is taken. BF16 (or fp16) inputs are computed
in fp32; the loss is fp32 (as in torchvision) and the input gradient has the input's dtype.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch.autograd.function import once_differentiable
from torch.nn import functional as F

from .bindings import focal_loss_kernel
from .buffers import GradientPool
from .build import NativeKernelUnavailable

REDUCTIONS = ("none", "mean", "sum")
# "native": the C kernel (focal_loss.c); "torch": cache-blocked PyTorch ops; "auto": native
# where it applies and builds, else torch.
BACKENDS = ("auto", "native", "torch")
NATIVE_DTYPES = (torch.float32, torch.bfloat16)
# Elements per block: 256 Ki fp32 = 1 MiB per block tensor; the forward touches ~5 and the
# backward ~7 of them, which stays inside a typical L2 + L3 slice and keeps the per-op
# Python overhead (a few microseconds) small against the work of each op.
BLOCK_ELEMENTS = 1 << 18
# The native pass's gradients: recycled once dropped, so that a training step's 254 MB
# gradient is not page-faulted in afresh every step (see kernels/buffers.py).
_GRADIENTS = GradientPool()


def _compute_dtype(inputs: torch.Tensor) -> torch.dtype:
    """float64 stays float64 (gradcheck, references); everything else is computed in fp32."""
    return torch.float64 if inputs.dtype == torch.float64 else torch.float32


def _blocks(numel: int, block: int) -> range:
    return range(0, numel, block)


def _block_terms(
    x: torch.Tensor, y: torch.Tensor, alpha: float, gamma: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(p, ce, m, a_t) for one fp32 block; ``a_t`` is None when alpha < 0 (no weighting)."""
    p = torch.sigmoid(x)
    # ce = max(x, 0) - x*y + log(1 + exp(-|x|)): no cancellation at either end (softplus(x)
    # - x*y would lose everything below fp32's spacing at |x| when y matches the sign of x).
    ce = torch.clamp_min(x, 0.0)
    ce.addcmul_(x, y, value=-1.0)
    ce.add_(F.softplus(torch.abs(x).neg_()))
    one_minus_2p = p.mul(-2.0).add_(1.0)
    m = torch.addcmul(p, y, one_minus_2p)  # p + y(1 - 2p) = p(1-y) + (1-p)y
    alpha_t = y.mul(2.0 * alpha - 1.0).add_(1.0 - alpha) if alpha >= 0 else None
    return p, ce, m, alpha_t


def _pow(m: torch.Tensor, exponent: float) -> torch.Tensor:
    """m**exponent with the common small integer exponents as multiplications."""
    if exponent == 0.0:
        return torch.ones_like(m)
    if exponent == 1.0:
        return m.clone()
    if exponent == 2.0:
        return m * m
    return m.pow(exponent)


def _forward_block(x: torch.Tensor, y: torch.Tensor, alpha: float, gamma: float) -> torch.Tensor:
    """The per-element focal loss of one fp32 block."""
    _, ce, m, alpha_t = _block_terms(x, y, alpha, gamma)
    loss = ce.mul_(_pow(m, gamma))
    return loss.mul_(alpha_t) if alpha_t is not None else loss


def _forward_block_sum(x: torch.Tensor, y: torch.Tensor, alpha: float, gamma: float) -> torch.Tensor:
    """sum(FL) of one fp32 block without writing the per-element loss's last product."""
    _, ce, m, alpha_t = _block_terms(x, y, alpha, gamma)
    ce.mul_(_pow(m, gamma))
    return torch.dot(ce, alpha_t) if alpha_t is not None else ce.sum()


def _grad_input_block(x: torch.Tensor, y: torch.Tensor, alpha: float, gamma: float) -> torch.Tensor:
    """dFL/dx of one fp32 block (before multiplying by the incoming gradient)."""
    p, ce, m, alpha_t = _block_terms(x, y, alpha, gamma)
    grad = p - y
    if gamma == 0.0:
        return grad.mul_(alpha_t) if alpha_t is not None else grad
    m_gm1 = _pow(m, gamma - 1.0)
    grad.mul_(m).mul_(m_gm1)  # (p - y) m**gamma
    sig_prime = torch.addcmul(p, p, p, value=-1.0)  # p(1-p)
    one_minus_2y = y.mul(-2.0).add_(1.0)
    sig_prime.mul_(ce).mul_(one_minus_2y).mul_(m_gm1)
    grad.add_(sig_prime, alpha=gamma)
    return grad.mul_(alpha_t) if alpha_t is not None else grad


def _grad_target_block(x: torch.Tensor, y: torch.Tensor, alpha: float, gamma: float) -> torch.Tensor:
    """dFL/dy of one fp32 block (before multiplying by the incoming gradient)."""
    p, ce, m, alpha_t = _block_terms(x, y, alpha, gamma)
    m_g = _pow(m, gamma)
    weight = alpha_t if alpha_t is not None else torch.ones_like(x)
    grad = torch.mul(x, weight).neg_().mul_(m_g)  # -a_t x m**gamma
    if alpha >= 0:
        grad.add_(ce * m_g, alpha=2.0 * alpha - 1.0)
    if gamma != 0.0:
        one_minus_2p = p.mul(-2.0).add_(1.0)
        grad.add_(ce.mul_(weight).mul_(one_minus_2p).mul_(_pow(m, gamma - 1.0)), alpha=gamma)
    return grad


class _SigmoidFocalLoss(torch.autograd.Function):
    """The autograd node: forward and backward both walk the inputs block by block."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        alpha: float,
        gamma: float,
        reduction: str,
        block: int,
    ) -> torch.Tensor:
        dt = _compute_dtype(inputs)
        x_flat = inputs.reshape(-1)
        y_flat = targets.reshape(-1)
        n = x_flat.numel()
        if reduction == "none":
            out = torch.empty(n, dtype=dt, device=inputs.device)
            for start in _blocks(n, block):
                stop = min(start + block, n)
                out[start:stop] = _forward_block(
                    x_flat[start:stop].to(dt), y_flat[start:stop].to(dt), alpha, gamma
                )
            result = out.view(inputs.shape)
        else:
            partial = [
                _forward_block_sum(
                    x_flat[start : start + block].to(dt), y_flat[start : start + block].to(dt),
                    alpha, gamma,
                )
                for start in _blocks(n, block)
            ]
            # Block sums added in float64: the total is more accurate than one fp32 sum.
            if partial:
                total = torch.stack(partial).double().sum()
            else:
                total = torch.zeros((), dtype=torch.float64, device=inputs.device)
            if reduction == "mean":
                total = total / n  # n == 0 gives nan, as torch.mean of an empty tensor does
            result = total.to(dt)
        ctx.save_for_backward(inputs, targets)
        ctx.alpha, ctx.gamma, ctx.reduction, ctx.block = alpha, gamma, reduction, block
        return result

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        inputs, targets = ctx.saved_tensors
        alpha, gamma, reduction, block = ctx.alpha, ctx.gamma, ctx.reduction, ctx.block
        dt = _compute_dtype(inputs)
        x_flat, y_flat = inputs.reshape(-1), targets.reshape(-1)
        n = x_flat.numel()
        if reduction == "none":
            g_flat = grad_output.reshape(-1)
            scale = None
        else:
            g_flat = None
            scale = grad_output.to(dt) / n if reduction == "mean" else grad_output.to(dt)

        def walk(block_grad: Any) -> torch.Tensor:
            grad = torch.empty(n, dtype=dt, device=inputs.device)
            for start in _blocks(n, block):
                stop = min(start + block, n)
                g = block_grad(x_flat[start:stop].to(dt), y_flat[start:stop].to(dt), alpha, gamma)
                if g_flat is not None:
                    g.mul_(g_flat[start:stop])
                grad[start:stop] = g
            if scale is not None:
                grad.mul_(scale)
            return grad

        grad_inputs = grad_targets = None
        if ctx.needs_input_grad[0]:
            grad_inputs = walk(_grad_input_block).view(inputs.shape).to(inputs.dtype)
        if ctx.needs_input_grad[1]:
            grad_targets = walk(_grad_target_block).view(targets.shape).to(targets.dtype)
        return grad_inputs, grad_targets, None, None, None, None


def _native_pass(
    inputs: torch.Tensor, targets: torch.Tensor, alpha: float, gamma: float, reduction: str, want_grad: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One kernel pass: (the reduced or per-element loss, dFL/dx scaled for the reduction or None)."""
    n = inputs.numel()
    lib = focal_loss_kernel()
    sums = torch.empty(lib.profilednn_focal_loss_blocks(n), dtype=torch.float64)
    per_element = torch.empty(inputs.shape, dtype=torch.float32) if reduction == "none" else None
    grad = _GRADIENTS.take(inputs.shape, inputs.dtype) if want_grad else None  # inputs are contiguous
    lib.profilednn_focal_loss(
        n, inputs.data_ptr(), targets.data_ptr(), int(inputs.dtype == torch.bfloat16), alpha, gamma,
        1.0 / n if reduction == "mean" and n else 1.0, sums.data_ptr(),
        per_element.data_ptr() if per_element is not None else None,
        grad.data_ptr() if grad is not None else None, torch.get_num_threads(),
    )
    if per_element is not None:
        return per_element, grad
    total = sums.sum()  # block sums added in float64, in a fixed order
    if reduction == "mean":
        total = total / n  # n == 0 gives nan, as torch.mean of an empty tensor does
    return total.to(torch.float32), grad


class _NativeSigmoidFocalLoss(torch.autograd.Function):
    """The autograd node over the C kernel: the forward writes the gradient in the same pass
    when the logits need one; the backward scales it by the incoming gradient."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, inputs: torch.Tensor, targets: torch.Tensor, alpha: float, gamma: float, reduction: str
    ) -> torch.Tensor:
        result, ctx.grad = _native_pass(inputs, targets, alpha, gamma, reduction, ctx.needs_input_grad[0])
        ctx.save_for_backward(inputs, targets)
        ctx.alpha, ctx.gamma, ctx.reduction = alpha, gamma, reduction
        return result

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        grad, ctx.grad = ctx.grad, None  # handed over to autograd, never reused
        if grad is None:  # a second backward (retain_graph=True): recompute, one pass
            inputs, targets = ctx.saved_tensors
            _, grad = _native_pass(inputs, targets, ctx.alpha, ctx.gamma, ctx.reduction, True)
        if ctx.reduction == "none" or float(grad_output) != 1.0:  # loss.backward() needs no pass
            grad.mul_(grad_output)
        return grad, None, None, None, None


def release_gradient_buffers() -> int:
    """Let the native kernel's recycled gradient buffers go (at most 2, each the size of a
    logits tensor seen); returns how many it held. New ones are allocated on the next call."""
    return _GRADIENTS.release()


_native_error: str | None = None  # why the kernel could not be built here, once known


def _native_applies(inputs: torch.Tensor, targets: torch.Tensor, backend: str) -> bool:
    """Whether this call takes the C kernel (see ``BACKENDS``)."""
    global _native_error
    if backend == "torch":
        return False
    why = None
    if inputs.device.type != "cpu":
        why = f"it runs on the CPU, not {inputs.device}"
    elif inputs.dtype not in NATIVE_DTYPES:
        why = f"it takes fp32 or bf16 logits, not {inputs.dtype}"
    elif targets.requires_grad:
        why = "it computes no gradient for the targets"
    if why is not None:
        if backend == "native":
            raise ValueError(f"sigmoid_focal_loss(backend='native'): {why}; use backend='auto' or 'torch'")
        return False
    if _native_error is not None and backend == "auto":
        return False
    try:
        focal_loss_kernel()
    except NativeKernelUnavailable as exc:
        if backend == "native":
            raise
        _native_error = str(exc)
        warnings.warn(f"sigmoid_focal_loss: the native kernel is unavailable ({exc}); using the "
                      "PyTorch-ops path, several times slower", RuntimeWarning, stacklevel=3)
        return False
    return True


def sigmoid_focal_loss(
    inputs: torch.Tensor,
    targets: torch.Tensor,
    alpha: float = 0.25,
    gamma: float = 2.0,
    reduction: str = "none",
    *,
    block_elements: int = BLOCK_ELEMENTS,
    backend: str = "auto",
) -> torch.Tensor:
    """The sigmoid focal loss, torchvision's signature and values, an explicit backward.

    ``inputs`` are logits of any shape (fp32, bf16 or fp16; computed in fp32), ``targets``
    the same shape with values in [0, 1] (float, bf16 or bool). ``alpha < 0`` turns the
    class weighting off; ``gamma >= 1`` keeps the gradient finite where ``1 - p_t`` is 0
    (``gamma = 0`` is plain weighted BCE). ``reduction`` is ``"none"`` (per element),
    ``"mean"`` or ``"sum"``. The loss is fp32; the gradient takes the dtype of the tensor
    it belongs to. ``backend``: "auto" takes the C kernel where it applies (fp32/bf16 CPU
    logits, targets without a gradient) and builds (else the PyTorch-ops path, with a
    warning when there is no compiler), "native" never falls back, "torch" is the
    PyTorch-ops path; ``block_elements`` is that path's block size.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
    if reduction not in REDUCTIONS:
        raise ValueError(
            f"Invalid Value for arg 'reduction': '{reduction} \n Supported reduction modes: "
            "'none', 'mean', 'sum'"
        )
    if inputs.shape != targets.shape:
        raise ValueError(f"inputs {tuple(inputs.shape)} and targets {tuple(targets.shape)} differ in shape")
    if block_elements < 1:
        raise ValueError(f"block_elements must be >= 1, got {block_elements}")
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    if not inputs.is_floating_point():
        raise ValueError(f"inputs must be floating point logits, got {inputs.dtype}")
    if _native_applies(inputs, targets, backend):
        if inputs.dtype == torch.bfloat16 and targets.is_floating_point() and targets.dtype != torch.bfloat16:
            inputs = inputs.float()  # soft fp32 targets are not rounded to bf16; autograd casts the gradient back
        targets = targets.to(inputs.dtype)  # exact: bool/int/bf16 0-1 targets, or fp32 ones for fp32 logits
        return _NativeSigmoidFocalLoss.apply(
            inputs.contiguous(), targets.detach().contiguous(), float(alpha), float(gamma), reduction)
    if targets.dtype == torch.bool or not targets.is_floating_point():
        targets = targets.to(inputs.dtype if inputs.dtype == torch.float64 else torch.float32)
    return _SigmoidFocalLoss.apply(
        inputs.contiguous(), targets.contiguous(), float(alpha), float(gamma), reduction, int(block_elements)
    )


__all__ = ["BACKENDS", "BLOCK_ELEMENTS", "release_gradient_buffers", "sigmoid_focal_loss"]

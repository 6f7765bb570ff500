"""``scaled_dot_product_attention`` whose dropout on the attention probabilities runs the
fused kernel.

On a CPU, ``F.scaled_dot_product_attention`` with ``dropout_p > 0`` takes its math path
(PyTorch's fused CPU attention kernel takes no dropout): ``softmax(q k^T s + mask)``, then
stock dropout on the probabilities, the layer's largest tensor ([batch, heads, L, S]):
``aten::bernoulli_`` draws every element from the global generator, and the mask is kept
for the backward. In nanoGPT's fp32 step (4 layers, batch 16, block 128, dropout 0.1) on a
2-core Xeon with AMX, those draws took 22 ms of 288 a step. ``scaled_dot_product_attention``
here has the same signature and computes the same math path with ``FusedDropout`` on the
probabilities (Philox mask drawn in the pass that applies it, regenerated for the backward);
a call without dropout, on other devices or dtypes, with ``enable_gqa``, or where the kernel
cannot be built runs torch's own. Under ``torch.compile`` the math path is traced and the
dropout stays the opaque custom op, whose seed is drawn from torch's generator inside it: the
same masks compiled or not. Its masks are not stock's: the random-stream gate judges it
(``fused_dropout``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch.nn import functional as F

from .dropout import FusedDropout, fused_dropout, native_available

TORCH_SDPA = F.scaled_dot_product_attention  # torch's own, whatever later patches the attribute
VALUE_DTYPES = (torch.float32, torch.bfloat16)


def applies(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None,
            dropout_p: float, is_causal: bool, enable_gqa: bool, native: bool | None = None) -> bool:
    """Whether the fused path takes this call (else torch's own runs it). ``native``: whether
    the kernel builds here, when the caller knows (asked otherwise: not inside a trace)."""
    if dropout_p <= 0.0 or enable_gqa:
        return False
    if not (native if native is not None else native_available()):
        return False
    if is_causal and attn_mask is not None:
        return False  # torch rejects the pair: let it say so
    tensors = (query, key, value)
    if any(t.device.type != "cpu" or t.is_nested or t.dim() < 2 for t in tensors):
        return False
    return query.dtype in VALUE_DTYPES and key.dtype == query.dtype and value.dtype == query.dtype


def attention_math(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None,
                   is_causal: bool, scale: float | None, dropout: Callable[[torch.Tensor], torch.Tensor]
                   ) -> torch.Tensor:
    """SDPA's math path with ``dropout`` applied to the probabilities: ``dropout(softmax(q k^T
    s + mask)) v``; rows masked everywhere give zeros, as torch's ``_safe_softmax`` does.
    As torch's CPU math path, it computes in fp32 whatever the inputs' dtype (BF16 inputs, or
    the BF16 autocast casts SDPA's inputs to, are upcast) and returns that dtype: the
    precision is stock's, only the dropout's kernel differs."""
    dtype = query.dtype
    if torch.is_autocast_enabled("cpu"):  # autocast runs SDPA in its lower precision: cast as it would
        dtype = torch.get_autocast_dtype("cpu")
        query, key, value = query.to(dtype), key.to(dtype), value.to(dtype)
    with torch.autocast("cpu", enabled=False):
        q, k, v = query.float(), key.float(), value.float()
        s = scale if scale is not None else 1.0 / math.sqrt(q.size(-1))
        scores = torch.matmul(q, k.transpose(-2, -1)) * s
        if is_causal:
            keep = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool, device=q.device).tril()
            scores = scores.masked_fill(~keep, float("-inf"))
        elif attn_mask is not None:
            scores = (scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool
                      else scores + attn_mask.float())
        probs = torch.ops.aten._safe_softmax(scores, -1)
        return torch.matmul(dropout(probs), v).to(dtype)


_default_dropout: FusedDropout | None = None


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False,
                                 *, dropout: FusedDropout | None = None, native: bool | None = None
                                 ) -> torch.Tensor:
    """``F.scaled_dot_product_attention``'s signature and values; with ``dropout_p > 0`` on
    CPU fp32/bf16 the probabilities' dropout runs ``FusedDropout`` (``dropout``: the module
    to use, whose ``p`` is set to ``dropout_p``; default one of this module's own; under
    ``torch.compile`` the functional ``fused_dropout``). ``native``: see ``applies``."""
    if not applies(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa, native):
        extra = {"enable_gqa": True} if enable_gqa else {}
        return TORCH_SDPA(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                           scale=scale, **extra)
    if torch.compiler.is_compiling():  # no module state to set inside a trace
        p = float(dropout_p)
        return attention_math(query, key, value, attn_mask, is_causal, scale, lambda t: fused_dropout(t, p, True))
    global _default_dropout
    if dropout is None:
        if _default_dropout is None:
            _default_dropout = FusedDropout(0.5)
        dropout = _default_dropout
    dropout.p = float(dropout_p)
    dropout.train(True)  # dropout_p > 0 means dropout, as in torch's: the caller decides by the value
    return attention_math(query, key, value, attn_mask, is_causal, scale, dropout)


__all__ = ["TORCH_SDPA", "VALUE_DTYPES", "applies", "attention_math", "scaled_dot_product_attention"]

"""Put ``FusedDropout`` into a model: every ``nn.Dropout`` module, and the attention-probability
dropout inside ``nn.MultiheadAttention``, draw their masks with the fused kernel.

``nn.MultiheadAttention`` applies its dropout functionally, inside
``F.scaled_dot_product_attention``; on a CPU a positive ``dropout_p`` sends it down the math
path (matmul, softmax, ``dropout`` = ``bernoulli_``, matmul). ``FusedDropoutAttention``
(a subclass sharing the module's parameters, so the state dict and an optimizer built on the
model are unchanged) computes that same path itself, in training with a positive dropout
and the plain self-attention arguments ``nn.TransformerEncoderLayer`` passes (no masks,
``need_weights=False``), with ``fused_dropout`` on the probabilities; every other call runs
the stock forward. Dropout1d/2d/3d (whole channels) and AlphaDropout are other functions
and stay as they are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from .compile_cache import KeyedOnKernels
from .dropout import FusedDropout


class FusedDropoutAttention(KeyedOnKernels, nn.MultiheadAttention):
    """``nn.MultiheadAttention`` whose training attention dropout runs the fused kernel (see
    the module doc); same parameters, buffers and state dict. Its ``dropout`` is the
    probability of the ``attn_dropout`` submodule (a ``FusedDropout``, no state), so what
    sets one sets the other and a hook on dropout modules sees this site too."""

    attn_dropout: FusedDropout

    @classmethod
    def from_attention(cls, mha: nn.MultiheadAttention) -> "FusedDropoutAttention":
        """A fused module sharing ``mha``'s parameters and buffers (no copy)."""
        fused = cls.__new__(cls)
        nn.Module.__init__(fused)
        fused.__dict__.update({k: v for k, v in mha.__dict__.items()
                               if k not in ("_parameters", "_buffers", "_modules", "dropout")})
        fused._parameters = mha._parameters
        fused._buffers = mha._buffers
        fused._modules = dict(mha._modules)
        fused.attn_dropout = FusedDropout(float(mha.dropout))
        fused.attn_dropout.train(mha.training)
        return fused

    @property
    def dropout(self) -> float:  # type: ignore[override]
        return self.attn_dropout.p

    @dropout.setter
    def dropout(self, p: float) -> None:
        self.attn_dropout.p = p

    def _fused_path(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    key_padding_mask: torch.Tensor | None, need_weights: bool, attn_mask: torch.Tensor | None,
                    is_causal: bool) -> bool:
        return (self.training and self.dropout > 0.0 and self.attn_dropout.native and not need_weights
                and key_padding_mask is None and attn_mask is None and not is_causal
                and query is key and key is value and query.dim() == 3)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,  # type: ignore[override]
                key_padding_mask: torch.Tensor | None = None, need_weights: bool = True,
                attn_mask: torch.Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not self._fused_path(query, key, value, key_padding_mask, need_weights, attn_mask, is_causal):
            return super().forward(query, key, value, key_padding_mask=key_padding_mask,
                                   need_weights=need_weights, attn_mask=attn_mask,
                                   average_attn_weights=average_attn_weights, is_causal=is_causal)
        return self_attention(self, query, self.attn_dropout), None


def self_attention(mha: nn.MultiheadAttention, x: torch.Tensor, dropout: nn.Module) -> torch.Tensor:
    """``mha(x, x, x, need_weights=False)[0]`` in training, as stock's math path computes it
    (q and k each scaled by head_dim**-1/4, softmax, ``dropout``, @ v)."""
    h = mha.num_heads
    xb = x if mha.batch_first else x.transpose(0, 1)  # [B, S, E]
    b, s, e = xb.shape
    d = e // h
    qkv = F.linear(xb, mha.in_proj_weight, mha.in_proj_bias).view(b, s, 3, h, d).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]  # [B, H, S, D]
    root = math.sqrt(1.0 / math.sqrt(d))
    scores = torch.matmul(q * root, k.transpose(-2, -1) * root)
    probs = dropout(torch.softmax(scores, dim=-1))
    out = torch.matmul(probs, v).transpose(1, 2).reshape(b, s, e)
    out = F.linear(out, mha.out_proj.weight, mha.out_proj.bias)
    return out if mha.batch_first else out.transpose(0, 1)


def attention_supported(mha: nn.MultiheadAttention) -> bool:
    """Whether ``FusedDropoutAttention`` can take this attention's training path: one packed
    q/k/v projection, no extra key/value biases, no zero attention."""
    return bool(mha._qkv_same_embed_dim and mha.bias_k is None and not mha.add_zero_attn
                and mha.in_proj_weight is not None)


@dataclass
class DropoutFusionSummary:
    """What ``fuse_dropout`` swapped: ``nn.Dropout`` modules and attention modules (with a
    positive dropout), and the attentions it left because their form is not supported."""

    dropouts: int = 0
    attentions: int = 0
    attentions_left: int = 0

    def describe(self) -> str:
        text = (f"{self.dropouts} nn.Dropout -> FusedDropout, {self.attentions} nn.MultiheadAttention -> "
                "FusedDropoutAttention (attention-probability dropout fused)")
        if self.attentions_left:
            text += f"; {self.attentions_left} attention(s) left stock (separate k/v projections or extra biases)"
        return text


def dropout_sites(model: nn.Module) -> DropoutFusionSummary:
    """What ``fuse_dropout`` would swap in ``model`` (nothing is changed)."""
    summary = DropoutFusionSummary()
    for m in model.modules():
        if type(m) is nn.Dropout and m.p > 0.0:
            summary.dropouts += 1
        elif type(m) is nn.MultiheadAttention and m.dropout > 0.0:
            if attention_supported(m):
                summary.attentions += 1
            else:
                summary.attentions_left += 1
    return summary


def fuse_dropout(model: nn.Module) -> DropoutFusionSummary:
    """Swap, in place, every ``nn.Dropout`` with p > 0 for ``FusedDropout`` and every supported
    ``nn.MultiheadAttention`` with dropout > 0 for ``FusedDropoutAttention``."""
    summary = DropoutFusionSummary()
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Dropout and child.p > 0.0:
                setattr(parent, name, FusedDropout.from_dropout(child))
                summary.dropouts += 1
            elif type(child) is nn.MultiheadAttention and child.dropout > 0.0:
                if attention_supported(child):
                    setattr(parent, name, FusedDropoutAttention.from_attention(child))
                    summary.attentions += 1
                else:
                    summary.attentions_left += 1
    return summary


__all__ = ["DropoutFusionSummary", "FusedDropoutAttention", "attention_supported", "dropout_sites",
           "fuse_dropout", "self_attention"]

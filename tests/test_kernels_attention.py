"""``profilednn.kernels.scaled_dot_product_attention``: torch's values without dropout (its
math path reproduced, and torch's own run where the fused path does not apply), and with
dropout a real dropout of the probabilities, its backward using the forward's mask."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from profilednn.kernels import scaled_dot_product_attention
from profilednn.kernels.attention import applies, attention_math
from profilednn.kernels.dropout import FusedDropout, native_available
from profilednn.optimization.stream_gate import Site, observe_first_call

pytestmark = pytest.mark.skipif(not native_available(), reason="the dropout kernel cannot be built here")


def _qkv(dtype: torch.dtype = torch.float32, shape: tuple[int, ...] = (2, 3, 9, 4)) -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.randn(shape).to(dtype).requires_grad_() for _ in range(3)]


@pytest.mark.parametrize("kw", [dict(is_causal=True), dict(attn_mask="bool"), dict(attn_mask="float"),
                                dict(scale=0.3), dict()])
def test_math_path_without_dropout_is_torchs(kw: dict) -> None:
    q, k, v = _qkv()
    g = torch.Generator().manual_seed(1)
    if kw.get("attn_mask") == "bool":
        kw = {"attn_mask": torch.rand(9, 9, generator=g) > 0.3}
    elif kw.get("attn_mask") == "float":
        kw = {"attn_mask": torch.randn(9, 9, generator=g)}
    ref = F.scaled_dot_product_attention(q, k, v, **kw)
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    ours = attention_math(q, k, v, kw.get("attn_mask"), kw.get("is_causal", False), kw.get("scale"), lambda t: t)
    grads = torch.autograd.grad(ours.square().sum(), (q, k, v))
    torch.testing.assert_close(ours, ref)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b)


def test_bf16_and_autocast_compute_in_fp32_as_torchs_math_path() -> None:
    q, k, v = _qkv(torch.bfloat16)
    ref = torch.ops.aten._scaled_dot_product_attention_math(q, k, v, None, 0.0, True)[0]
    ours = attention_math(q, k, v, None, True, None, lambda t: t)
    assert ours.dtype == torch.bfloat16
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)  # the same fp32 arithmetic, rounded once
    q32, k32, v32 = (t.detach().float() for t in (q, k, v))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        auto = attention_math(q32, k32, v32, None, True, None, lambda t: t)
    assert auto.dtype == torch.bfloat16
    torch.testing.assert_close(auto, ref.detach(), rtol=0, atol=0)


def test_fully_masked_rows_give_zeros_as_torchs_safe_softmax() -> None:
    q, k, v = _qkv()
    mask = torch.ones(9, 9, dtype=torch.bool)
    mask[2] = False
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    ours = attention_math(q, k, v, mask, False, None, lambda t: t)
    torch.testing.assert_close(ours, ref)
    assert torch.all(ours[..., 2, :] == 0)


def test_torchs_own_runs_where_the_fused_path_does_not_apply() -> None:
    q, k, v = _qkv()
    assert torch.equal(scaled_dot_product_attention(q, k, v, is_causal=True),
                       F.scaled_dot_product_attention(q, k, v, is_causal=True))  # no dropout
    assert not applies(q, k, v, None, 0.1, False, True)  # enable_gqa
    assert not applies(q, k, v, torch.ones(9, 9, dtype=torch.bool), 0.1, True, False)  # torch rejects the pair
    assert not applies(q.double(), k.double(), v.double(), None, 0.1, False, False)
    with pytest.raises(RuntimeError):  # the same error torch gives
        scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(9, 9, dtype=torch.bool), dropout_p=0.1,
                                     is_causal=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropout_on_the_probabilities_is_a_dropout_with_its_own_mask_backward(dtype: torch.dtype) -> None:
    q, k, v = _qkv(dtype, (4, 4, 64, 16))
    dropout = FusedDropout(0.5)
    site = Site("attention", 0.5)
    handles = observe_first_call(dropout, site)
    try:
        out = scaled_dot_product_attention(q, k, v, dropout_p=0.25, is_causal=True, dropout=dropout)
        out.float().square().sum().backward()
    finally:
        for h in handles:
            h.remove()
    assert out.dtype == dtype and out.shape == (4, 4, 64, 16)
    assert dropout.p == 0.25 and site.p == 0.25  # the call's dropout_p, not the module's former p
    assert site.n > 0 and not site.problems(6.0), site.problems(6.0)
    assert all(t.grad is not None and torch.isfinite(t.grad.float()).all() for t in (q, k, v))


def test_a_dropout_module_called_twice_a_step_is_paired_with_its_own_gradients() -> None:
    # One module shared by two layers: the first call's backward runs last; pairing the first
    # forward with the first backward to arrive would compare different calls.
    torch.manual_seed(0)
    drop = FusedDropout(0.3)
    model = nn.ModuleList([nn.Linear(16, 16), nn.Linear(16, 16)])
    site = Site("shared", 0.3)
    handles = observe_first_call(drop, site)
    try:
        x = torch.randn(256, 16)
        h = drop(model[0](x))
        drop(model[1](h)).square().sum().backward()
    finally:
        for handle in handles:
            handle.remove()
    assert site.backward_rel is not None and site.backward_rel < 1e-5
    assert not site.problems(6.0)

"""The fused dropout (``kernels/dropout.c``): keep rate, scale, the backward's mask,
reproducibility, dtypes and layouts, torch.compile, and the model rewrite (``nn.Dropout``
modules and ``nn.MultiheadAttention``'s attention-probability dropout)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from profilednn.kernels.dropout import FusedDropout, apply_mask, fused_dropout, native_available, threshold
from profilednn.kernels.dropout_fusion import FusedDropoutAttention, dropout_sites, fuse_dropout, self_attention

pytestmark = pytest.mark.skipif(not native_available(), reason="no C compiler: the fused kernel cannot be built")


def _x(shape: tuple[int, ...] = (4, 33, 97), dtype: torch.dtype = torch.float32, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g) + 0.5).to(dtype)  # never 0: every zero of y is a drop


@pytest.mark.parametrize("p", [0.05, 0.1, 0.5, 0.9])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_keep_rate_within_binomial_bounds_and_kept_values_scaled(p, dtype):
    x = _x((64, 1001), dtype)  # 64,064 elements: whole chunks and a partial one
    torch.manual_seed(0)
    y = fused_dropout(x, p)
    kept = y != 0
    n = x.numel()
    assert abs(float(kept.double().mean()) - (1 - p)) <= 5 * math.sqrt(p * (1 - p) / n)
    scale = torch.tensor(1.0 / (1.0 - p), dtype=torch.float32)  # the kernel's fp32 scale
    expected = (x.float() * scale).to(dtype)  # what a kept element becomes, rounded once
    assert torch.equal(y[kept], expected[kept])
    assert y.dtype == dtype and y.shape == x.shape


def test_threshold_edges():
    assert threshold(0.0) == 0
    assert threshold(0.5) == 2**31
    assert threshold(1.0) == 2**32 - 1


def test_backward_uses_the_forwards_mask():
    x = _x().requires_grad_()
    torch.manual_seed(3)
    y = fused_dropout(x, 0.3)
    g = torch.randn_like(y)
    y.backward(g)
    mask = (y != 0).float()
    assert torch.allclose(x.grad, g * mask / 0.7, rtol=1e-6, atol=0)
    # grad equals the out / x pattern
    assert torch.allclose(x.grad, g * (y / x).detach(), rtol=1e-5, atol=0)


def test_reproducible_under_manual_seed_and_seeds_differ():
    x = _x()
    torch.manual_seed(7)
    a = fused_dropout(x, 0.5)
    torch.manual_seed(7)
    b = fused_dropout(x, 0.5)
    torch.manual_seed(8)
    c = fused_dropout(x, 0.5)
    d = fused_dropout(x, 0.5)  # the next call draws a new seed
    assert torch.equal(a, b)
    assert not torch.equal(a != 0, c != 0)
    assert not torch.equal(c != 0, d != 0)


def test_offset_moves_the_stream_and_masks_are_uncorrelated():
    x = torch.ones(40_000)
    a = apply_mask(x, 0.5, seed=123, offset=0) != 0
    b = apply_mask(x, 0.5, seed=123, offset=1) != 0
    c = apply_mask(x, 0.5, seed=124, offset=0) != 0
    for other in (b, c):
        agree = float((a == other).double().mean())
        assert abs(agree - 0.5) < 5 * math.sqrt(0.25 / x.numel())


def test_non_contiguous_input_follows_the_logical_order():
    base = _x((8, 40, 30))
    view = base.transpose(1, 2)  # non-contiguous
    torch.manual_seed(5)
    y_view = fused_dropout(view, 0.2)
    torch.manual_seed(5)
    y_cont = fused_dropout(view.contiguous(), 0.2)
    assert torch.equal(y_view, y_cont)
    v = view.clone().requires_grad_()
    torch.manual_seed(5)
    out = fused_dropout(v, 0.2)
    out.sum().backward()
    assert torch.equal(v.grad != 0, out != 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_eval_and_p0_are_identity_p1_is_zeros(dtype):
    x = _x(dtype=dtype)
    m = FusedDropout(0.4).eval()
    assert m(x) is x
    assert fused_dropout(x, 0.0) is x
    z = fused_dropout(x.requires_grad_(), 1.0)
    assert torch.equal(z, torch.zeros_like(x))
    z.sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(x))
    with pytest.raises(ValueError, match="between 0 and 1"):
        fused_dropout(x, 1.5)


def test_other_dtypes_run_stock():
    x = _x(dtype=torch.float64)
    torch.manual_seed(2)
    ours = fused_dropout(x, 0.3)
    torch.manual_seed(2)
    stock = nn.functional.dropout(x, 0.3, True)
    assert torch.equal(ours, stock)


def test_torch_compile_matches_eager():
    model = nn.Sequential(nn.Linear(32, 64), FusedDropout(0.25), nn.ReLU(), nn.Linear(64, 8), FusedDropout(0.1))
    x = _x((16, 32))
    torch.manual_seed(11)
    eager = model(x)
    eager.sum().backward()
    eager_grad = model[0].weight.grad.clone()
    model.zero_grad()
    compiled = torch.compile(model)
    torch.manual_seed(11)
    out = compiled(x)
    out.sum().backward()
    assert torch.allclose(out, eager, rtol=1e-5, atol=1e-6)
    assert torch.equal(out != 0, eager != 0)
    assert torch.allclose(model[0].weight.grad, eager_grad, rtol=1e-4, atol=1e-6)


def test_under_autocast_the_dropout_keeps_bf16():
    lin = nn.Linear(24, 24)
    x = _x((6, 24))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = FusedDropout(0.5)(lin(x))
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert lin.weight.grad is not None and torch.isfinite(lin.weight.grad).all()


# ------------------------------------------------------------------ the model rewrite
def _encoder() -> nn.Module:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.1, batch_first=True)
    return nn.Sequential(nn.Dropout(0.1), nn.TransformerEncoder(layer, 2, enable_nested_tensor=False))


def test_fuse_dropout_swaps_modules_and_attention_and_keeps_the_state_dict():
    model = _encoder()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params_before = [id(p) for p in model.parameters()]
    summary = fuse_dropout(model)
    assert (summary.dropouts, summary.attentions, summary.attentions_left) == (7, 2, 0)
    assert dropout_sites(model).dropouts == 0  # nothing stock left
    assert sum(isinstance(m, FusedDropoutAttention) for m in model.modules()) == 2
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], before[k]) for k in before)
    assert [id(p) for p in model.parameters()] == params_before


@pytest.mark.parametrize("batch_first", [True, False])
def test_attention_path_equals_stock_math_path_without_dropout(batch_first):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(32, 4, dropout=0.0, batch_first=batch_first)
    x = _x((3, 7, 32) if batch_first else (7, 3, 32))
    with sdpa_kernel(SDPBackend.MATH):
        stock = mha(x, x, x, need_weights=False)[0]
    assert torch.equal(self_attention(mha, x, nn.Identity()), stock)


def test_fused_attention_drops_probabilities_and_eval_is_stock():
    model = _encoder()
    stock = copy.deepcopy(model).eval()
    fuse_dropout(model)
    x = _x((2, 9, 32))
    model.eval()
    assert torch.allclose(model(x), stock(x), rtol=1e-5, atol=1e-6)
    model.train()
    attn = model[1].layers[0].self_attn
    assert attn.dropout == pytest.approx(0.1) and attn.attn_dropout.p == pytest.approx(0.1)
    attn.dropout = 0.0  # the numerics check's dropout_off sets it so
    assert attn.attn_dropout.p == 0.0
    attn.dropout = 0.1
    torch.manual_seed(4)
    a = model(x)
    torch.manual_seed(4)
    b = model(x)
    assert torch.equal(a, b)
    a.sum().backward()
    assert all(p.grad is not None for p in model.parameters())

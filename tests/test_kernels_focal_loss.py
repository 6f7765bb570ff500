"""profilednn.kernels.sigmoid_focal_loss against torchvision's, float64 truth and gradcheck."""

from __future__ import annotations

import pytest
import torch
import torchvision

from profilednn.kernels import sigmoid_focal_loss

REFERENCE = torchvision.ops.sigmoid_focal_loss
SETTINGS = [(0.25, 2.0), (-1.0, 2.0), (0.3, 1.5), (0.25, 0.0), (0.6, 3.0), (0.25, 1.0)]


def _data(shape=(2, 37, 11), scale=4.0, positive=0.1, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype)
    y = (torch.rand(shape, generator=g) < positive).to(dtype)
    return x, y


def _close(a: torch.Tensor, b: torch.Tensor, rtol: float = 1e-5) -> bool:
    """Within ``rtol`` relative, with an absolute floor at fp32 resolution of the largest value."""
    floor = 1e-6 * float(b.abs().max()) if b.numel() else 0.0
    return bool(((a - b).abs() <= rtol * b.abs() + floor).all())


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("alpha,gamma", SETTINGS)
def test_values_and_grads_match_torchvision_fp32(reduction, alpha, gamma):
    x, y = _data()
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    # A block of 64 elements cuts the 814 values into 13 uneven blocks.
    ours = sigmoid_focal_loss(xa, y, alpha=alpha, gamma=gamma, reduction=reduction, block_elements=64)
    ref = REFERENCE(xb, y, alpha=alpha, gamma=gamma, reduction=reduction)
    assert ours.dtype == torch.float32 and ours.shape == ref.shape
    assert _close(ours.detach(), ref.detach())
    upstream = torch.randn_like(ref)
    (ours * upstream).sum().backward()
    (ref * upstream).sum().backward()
    assert _close(xa.grad, xb.grad, rtol=1e-4)


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("alpha,gamma", SETTINGS)
def test_gradcheck_float64_inputs_and_targets(reduction, alpha, gamma):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(3, 5, generator=g, dtype=torch.float64) * 2).requires_grad_()
    y = torch.rand(3, 5, generator=g, dtype=torch.float64).requires_grad_()  # soft targets

    def fn(a, b):
        return sigmoid_focal_loss(a, b, alpha=alpha, gamma=gamma, reduction=reduction, block_elements=4)

    assert torch.autograd.gradcheck(fn, (x, y))


def test_forward_matches_float64_truth_as_well_as_torchvision():
    x, y = _data(scale=8.0, positive=0.3)
    truth = REFERENCE(x.double(), y.double())
    ours_err = (sigmoid_focal_loss(x, y).double() - truth).abs().max()
    ref_err = (REFERENCE(x, y).double() - truth).abs().max()
    assert ours_err <= ref_err * 1.01 + 1e-12


def test_large_logits_are_stable():
    x = torch.tensor([-1e4, -100.0, -30.0, -5.0, 0.0, 5.0, 30.0, 100.0, 1e4])
    for target in (0.0, 1.0):
        y = torch.full_like(x, target)
        xr = x.clone().requires_grad_()
        loss = sigmoid_focal_loss(xr, y, reduction="none")
        loss.sum().backward()
        truth = REFERENCE(x.double(), y.double())
        assert torch.isfinite(loss).all() and torch.isfinite(xr.grad).all()
        assert torch.allclose(loss.double(), truth, rtol=1e-5, atol=1e-30)
        # Confident and wrong: the gradient saturates at -alpha (y=1) or 1-alpha (y=0).
        if target == 1.0:
            assert xr.grad[0].item() == pytest.approx(-0.25)
        else:
            assert xr.grad[-1].item() == pytest.approx(0.75)


def test_bf16_inputs_compute_in_fp32_and_return_bf16_grads():
    x, y = _data(dtype=torch.float32)
    xb = x.to(torch.bfloat16).requires_grad_()
    loss = sigmoid_focal_loss(xb, y.to(torch.bfloat16), reduction="sum")
    assert loss.dtype == torch.float32
    loss.backward()
    assert xb.grad.dtype == torch.bfloat16
    x32 = xb.detach().float().requires_grad_()  # the same (rounded) values in fp32
    ref = REFERENCE(x32, y, reduction="sum")
    ref.backward()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    assert torch.allclose(xb.grad.float(), x32.grad, rtol=1e-2, atol=1e-3)


def test_bool_targets_and_empty_input():
    x, y = _data()
    assert torch.allclose(sigmoid_focal_loss(x, y.bool(), reduction="sum"), REFERENCE(x, y, reduction="sum"),
                          rtol=1e-5)
    empty = torch.zeros(0, 4)
    assert sigmoid_focal_loss(empty, empty, reduction="sum").item() == 0.0
    assert sigmoid_focal_loss(empty, empty).shape == (0, 4)


def test_bad_arguments():
    x, y = _data()
    with pytest.raises(ValueError, match="reduction"):
        sigmoid_focal_loss(x, y, reduction="max")
    with pytest.raises(ValueError, match="shape"):
        sigmoid_focal_loss(x, y[:, :3])
    with pytest.raises(ValueError, match="gamma"):
        sigmoid_focal_loss(x, y, gamma=-1.0)

"""Max pooling kept on ATen's kernels inside ``torch.compile`` (``kernels/aten_pool.py``):
the same values and gradients as ``nn.MaxPool2d`` eager and compiled, and a compiled
backward that runs ATen's max-pool backward rather than Inductor's scatter."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.profiler import profile

from profilednn.kernels import AtenMaxPool2d, keep_aten_pools

CL = torch.channels_last


def _run(pool: nn.Module, x: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.detach().clone().requires_grad_()
    y = pool(x)
    y.backward(g)
    return y, x.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("args", [dict(kernel_size=3, stride=2, padding=1), dict(kernel_size=2),
                                  dict(kernel_size=3, stride=2, ceil_mode=True), dict(kernel_size=(3, 2), dilation=2)])
def test_same_values_and_gradients_as_nn_maxpool2d(dtype: torch.dtype, args: dict) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 5, 11, 9).to(dtype).contiguous(memory_format=CL)
    stock = nn.MaxPool2d(**args)
    g = torch.randn(stock(x).shape).to(dtype)
    y0, dx0 = _run(stock, x, g)
    y1, dx1 = _run(AtenMaxPool2d.from_pool(stock), x, g)
    assert torch.equal(y0, y1) and torch.equal(dx0, dx1)
    assert y1.is_contiguous(memory_format=CL)


def test_compiled_backward_runs_atens_kernel_not_a_scatter() -> None:
    pytest.importorskip("torch._dynamo")
    torch.manual_seed(0)
    x = torch.randn(2, 8, 12, 12).contiguous(memory_format=CL)
    model = nn.Sequential(nn.Conv2d(8, 8, 1), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
    stock = nn.Sequential(*[m for m in model])  # the same modules, before the swap
    g = torch.randn(2, 8, 6, 6)
    y0, dx0 = _run(stock, x, g)
    grads0 = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    assert keep_aten_pools(model) == ["2"] and isinstance(model[2], AtenMaxPool2d)
    compiled = torch.compile(model)
    _run(compiled, x, g)  # compiles
    model.zero_grad()
    with profile() as prof:
        y1, dx1 = _run(compiled, x, g)
    ops = {e.key for e in prof.key_averages()}
    assert "aten::max_pool2d_with_indices_backward" in ops
    assert not {"aten::scatter_add", "aten::scatter_reduce_", "aten::scatter_add_"} & ops
    torch.testing.assert_close(y1, y0)
    torch.testing.assert_close(dx1, dx0)
    for p, g0 in zip(model.parameters(), grads0):
        torch.testing.assert_close(p.grad, g0)


def test_indices_unbatched_inputs_run_stock_and_swap_leaves_other_pools() -> None:
    pool = AtenMaxPool2d(2, return_indices=True)
    with profile() as prof:
        y, idx = pool(torch.randn(1, 2, 4, 4))
        AtenMaxPool2d(2)(torch.randn(2, 4, 4))  # unbatched: 3-D
    assert idx.dtype == torch.int64 and y.shape == (1, 2, 2, 2)
    assert not any(e.key.startswith("profilednn::") for e in prof.key_averages())
    model = nn.Sequential(nn.MaxPool2d(2), nn.AvgPool2d(2), nn.Sequential(nn.MaxPool2d(3, 1)))
    assert keep_aten_pools(model) == ["0", "2.0"] and type(model[1]) is nn.AvgPool2d
    assert model[2][0].kernel_size == 3 and model[2][0].stride == 1
    assert keep_aten_pools(model) == []  # already swapped

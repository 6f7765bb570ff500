"""1x1 convolutions as GEMMs over channels_last rows (``kernels/pointwise_conv.py``):
values and gradients against stock ``nn.Conv2d`` in both layouts, fp32 and under BF16
autocast, strides 1 and 2, with and without bias; that the GEMM ops run on channels_last
activations and stock ATen on NCHW ones; the fallbacks; the swap; the fx trace of
``fuse_batch_norm``; ``torch.compile``; FLOP counts."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.profiler import profile

from profilednn.kernels import fuse_batch_norm
from profilednn.kernels.pointwise_conv import PointwiseGemmConv2d, eligible, pointwise_gemms

CL = torch.channels_last


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _grads(conv: nn.Module, x: torch.Tensor, g: torch.Tensor, bf16: bool) -> tuple[torch.Tensor, ...]:
    x = x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        y = conv(x)
    y.backward(g.to(y.dtype))
    return y, x.grad, conv.weight.grad, (conv.bias.grad if conv.bias is not None else None)


def _ops(fn) -> dict[str, int]:
    with profile() as prof:
        fn()
    return {e.key: e.count for e in prof.key_averages() if e.key.startswith("profilednn::conv1x1")}


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("bias", [False, True])
def test_values_and_gradients_match_stock(bf16: bool, stride: int, channels_last: bool, bias: bool) -> None:
    torch.manual_seed(0)
    stock = nn.Conv2d(24, 40, 1, stride=stride, bias=bias)
    ours = copy.deepcopy(stock)
    x = torch.randn(3, 24, 9, 9)
    if channels_last:
        stock, ours, x = stock.to(memory_format=CL), ours.to(memory_format=CL), x.contiguous(memory_format=CL)
    ours = PointwiseGemmConv2d.from_conv(ours)
    g = torch.randn(stock(x).shape)
    ys, dxs, dws, dbs = _grads(stock, x, g, bf16)
    yo, dxo, dwo, dbo = _grads(ours, x, g, bf16)
    assert yo.dtype == ys.dtype and yo.stride() == ys.stride()
    assert dxo.stride() == dxs.stride() and dwo.dtype == torch.float32 and dwo.shape == dws.shape
    if not channels_last:  # NCHW: stock ATen throughout, except the bias sum
        assert torch.equal(yo, ys) and torch.equal(dxo, dxs) and torch.equal(dwo, dws)
    # the GEMMs: the same sums, accumulated in another order (and rounded once to bf16)
    tol = 1e-2 if bf16 else 1e-5
    assert _rel(yo, ys) < tol and _rel(dxo, dxs) < tol and _rel(dwo, dws) < tol
    if bias:
        assert _rel(dbo, dbs) < (1e-2 if bf16 else 1e-5)


def test_the_gemm_runs_on_channels_last_activations_only() -> None:
    torch.manual_seed(0)
    conv = PointwiseGemmConv2d.from_conv(nn.Conv2d(8, 16, 1, stride=2)).to(memory_format=CL)
    x = torch.randn(2, 8, 6, 6, requires_grad=True)

    def step(inp: torch.Tensor) -> None:
        conv(inp).sum().backward()

    every = {"profilednn::conv1x1": 1, "profilednn::conv1x1_input_grad": 1, "profilednn::conv1x1_weight_grad": 1}
    with profile() as prof:
        step(x.contiguous(memory_format=CL))
    ran = {e.key for e in prof.key_averages()}
    assert _ops(lambda: step(x.contiguous(memory_format=CL))) == every
    assert "aten::mm" in ran and not {"aten::convolution", "aten::convolution_backward"} & ran
    with profile() as prof:
        step(x)
    ran = {e.key for e in prof.key_averages()}
    assert {"aten::convolution", "aten::convolution_backward"} <= ran and "aten::mm" not in ran  # NCHW: stock
    conv.weight.requires_grad_(False)  # no weight gradient asked: no GEMM for it either
    assert "profilednn::conv1x1_weight_grad" not in _ops(lambda: step(x.contiguous(memory_format=CL)))
    x.requires_grad_(False)
    assert _ops(lambda: conv(x.contiguous(memory_format=CL)).sum()) == {"profilednn::conv1x1": 1}


def test_evaluation_and_unsupported_dtypes_run_stock() -> None:
    conv = PointwiseGemmConv2d.from_conv(nn.Conv2d(4, 6, 1)).eval()
    x = torch.randn(1, 4, 3, 3)
    assert _ops(lambda: conv(x)) == {}
    conv.train()
    x64 = x.double()
    conv64 = PointwiseGemmConv2d.from_conv(nn.Conv2d(4, 6, 1).double())
    assert _ops(lambda: conv64(x64).sum().backward()) == {}
    assert conv64.weight.grad is not None and conv64.weight.grad.dtype == torch.float64


def test_swap_takes_only_plain_pointwise_convolutions_and_shares_parameters() -> None:
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 1), nn.Conv2d(8, 8, 1, groups=2),
                          nn.Conv2d(8, 8, 1, padding=1), nn.Conv2d(8, 8, 1, dilation=2),
                          nn.Sequential(nn.Conv2d(8, 4, 1, stride=2)))
    weight = model[1].weight
    keys = list(model.state_dict())
    out, summary = pointwise_gemms(model)
    assert out is model and summary.swapped == ["1", "5.0"] and summary.other_convolutions == 4
    assert isinstance(model[1], PointwiseGemmConv2d) and model[1].weight is weight
    assert type(model[2]) is nn.Conv2d and type(model[3]) is nn.Conv2d and type(model[4]) is nn.Conv2d
    assert list(model.state_dict()) == keys
    assert "2 1x1 Conv2d -> PointwiseGemmConv2d" in summary.describe()
    assert pointwise_gemms(model)[1].swapped == []  # a second call changes nothing
    assert not eligible(model[1])
    with pytest.raises(ValueError, match="not a 1x1 convolution"):
        PointwiseGemmConv2d.from_conv(model[0])


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(8, 4, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 8, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + x)


def test_fuse_batch_norm_keeps_the_swapped_convolutions_as_calls_in_its_trace() -> None:
    pytest.importorskip("profilednn.kernels.batch_norm")
    from profilednn.kernels.batch_norm import native_available

    if not native_available():
        pytest.skip("no C compiler: the fused batch norm cannot be built")
    torch.manual_seed(0)
    model = _Block().to(memory_format=CL)
    pointwise_gemms(model)
    fused, summary = fuse_batch_norm(model)
    assert summary.traced and summary.with_relu == 1 and summary.with_add_relu == 1
    assert sum(isinstance(m, PointwiseGemmConv2d) for m in fused.modules()) == 2
    x = torch.randn(2, 8, 5, 5).contiguous(memory_format=CL)
    # traced outside autocast, the convolutions still see BF16 when run under it
    counts = _ops(lambda: _run_bf16(fused, x))
    assert counts == {"profilednn::conv1x1": 2, "profilednn::conv1x1_input_grad": 1,
                      "profilednn::conv1x1_weight_grad": 2}  # x itself needs no gradient


def _run_bf16(model: nn.Module, x: torch.Tensor) -> None:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = model(x)
    y.float().sum().backward()


def test_compiles_without_graph_breaks_and_trains_the_same() -> None:
    dynamo = pytest.importorskip("torch._dynamo")
    torch.manual_seed(0)
    stock = nn.Sequential(nn.Conv2d(6, 12, 1), nn.ReLU(), nn.Conv2d(12, 6, 1, stride=2)).to(memory_format=CL)
    ours = copy.deepcopy(stock)
    pointwise_gemms(ours)
    x = torch.randn(2, 6, 8, 8).contiguous(memory_format=CL)
    assert dynamo.explain(ours)(x).graph_break_count == 0
    compiled = torch.compile(ours)
    compiled(x).sum().backward()
    stock(x).sum().backward()
    for a, b in zip(ours.parameters(), stock.parameters()):
        assert _rel(a.grad, b.grad) < 1e-5


def test_model_flops_are_the_same_counted_through_the_custom_ops() -> None:
    from torch.utils.flop_counter import FlopCounterMode

    from profilednn.optimization.flops import DtypeFlopCounter

    def counted(model: nn.Module) -> tuple[float, dict[str, float]]:
        x = torch.randn(2, 8, 6, 6).contiguous(memory_format=CL).requires_grad_()
        plain, by_dtype = FlopCounterMode(display=False), DtypeFlopCounter()
        for counter in (plain, by_dtype):
            with counter:
                model(x).sum().backward()
        return float(plain.get_total_flops()), dict(by_dtype.flops)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(8, 16, 1), nn.Conv2d(16, 4, 1, stride=2)).to(memory_format=CL)
    stock = counted(model)
    pointwise_gemms(model)
    assert counted(model) == stock and stock[0] > 0  # MFU must not depend on which kernel ran

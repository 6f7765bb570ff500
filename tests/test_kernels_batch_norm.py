"""The fused training batch norm (``kernels/batch_norm.c``): values, gradients and running
statistics against stock PyTorch (and an fp64 reference), both layouts and both value
dtypes, with the ReLU and the residual add fused; the fx rewrite; the fallbacks."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import fx, nn
from torch.nn import functional as F

from profilednn.kernels.batch_norm import FusedBatchNorm2d, applies, native_available
from profilednn.kernels.batch_norm_fusion import fuse_batch_norm

pytestmark = pytest.mark.skipif(not native_available(), reason="no C compiler: the fused kernel cannot be built")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _pair(c: int = 12) -> tuple[nn.BatchNorm2d, nn.BatchNorm2d]:
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(c)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    return bn, copy.deepcopy(bn)


def _input(shape: tuple[int, ...], dtype: torch.dtype, channels_last: bool, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 3 + 1).to(dtype)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


def _tail(bn: nn.BatchNorm2d, x: torch.Tensor, r: torch.Tensor | None, relu: bool) -> torch.Tensor:
    y = bn(x)
    if r is not None:
        y = y + r
    return F.relu(y) if relu else y


def _run(fn, x: torch.Tensor, r: torch.Tensor | None, g: torch.Tensor) -> list[torch.Tensor]:
    """Output and input gradients of ``fn(x, r)`` for the incoming gradient ``g``."""
    x = x.clone().requires_grad_()
    r = r.clone().requires_grad_() if r is not None else None
    y = fn(x, r)
    y.backward(g.to(y.dtype))
    return [y.detach(), x.grad] + ([r.grad] if r is not None else [])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("tail", ["none", "relu", "add_relu"])
def test_matches_stock_forward_backward_and_running_stats(dtype, channels_last, tail) -> None:
    """Against an fp64 reference on the same inputs, the fused kernel is as close as stock
    (a ReLU whose input lies within rounding of 0 may take either side in either)."""
    stock, mine = _pair()
    reference = copy.deepcopy(stock).double()
    fused = FusedBatchNorm2d.from_batch_norm(mine, relu=tail != "none")
    relu = tail != "none"
    x = _input((4, 12, 7, 9), dtype, channels_last)
    r = _input((4, 12, 7, 9), dtype, channels_last, seed=2) if tail == "add_relu" else None
    g = _input((4, 12, 7, 9), dtype, channels_last, seed=3)
    ref = _run(lambda a, b: _tail(reference, a, b, relu), x.double(), None if r is None else r.double(), g.double())
    got_stock = _run(lambda a, b: _tail(stock, a, b, relu), x, r, g)
    got = _run(lambda a, b: fused(a, b), x, r, g)
    assert got[0].dtype == dtype and got[0].is_contiguous(
        memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    floor = 1e-5 if dtype == torch.float32 else 1e-2
    for mine_t, stock_t, ref_t in zip(got, got_stock, ref):
        assert _rel(mine_t, ref_t) <= max(1.5 * _rel(stock_t, ref_t), floor)
    for name in ("weight", "bias"):
        assert _rel(getattr(mine, name).grad, getattr(reference, name).grad) <= max(
            1.5 * _rel(getattr(stock, name).grad, getattr(reference, name).grad), floor)
    assert _rel(mine.running_mean, stock.running_mean) < 1e-5
    assert _rel(mine.running_var, stock.running_var) < 1e-4
    assert int(mine.num_batches_tracked) == int(stock.num_batches_tracked) == 1


def test_statistics_closer_to_fp64_than_stock_channels_last() -> None:
    stock, mine = _pair(64)
    fused = FusedBatchNorm2d.from_batch_norm(mine)
    x = _input((8, 64, 28, 28), torch.float32, True) * 50 + 1000  # a large mean: cancellation-prone
    ref = copy.deepcopy(stock).double()(x.double())
    with torch.no_grad():
        err_fused = _rel(fused(x), ref)
    assert err_fused < 1e-6
    assert err_fused <= _rel(stock(x).detach(), ref) * 1.01


def test_results_do_not_depend_on_the_thread_count() -> None:
    x = _input((4, 32, 16, 16), torch.float32, True).requires_grad_()
    outs = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            _, bn = _pair(32)
            fused = FusedBatchNorm2d.from_batch_norm(bn, relu=True)
            y = fused(x)
            (gx,) = torch.autograd.grad(y, x, torch.ones_like(y))
            outs.append((y.detach(), gx, bn.running_var.clone()))
    finally:
        torch.set_num_threads(before)
    for a, b in zip(*outs):
        assert torch.equal(a, b)


def test_eval_mode_and_unsupported_inputs_run_stock() -> None:
    stock, mine = _pair()
    fused = FusedBatchNorm2d.from_batch_norm(mine, relu=True)
    x = _input((2, 12, 5, 5), torch.float32, False)
    stock.train()(x)
    fused.train()(x)
    stock.eval()
    fused.eval()
    with torch.no_grad():  # the same running statistics: eval mode must then be stock's own kernel
        mine.running_mean.copy_(stock.running_mean)
        mine.running_var.copy_(stock.running_var)
    assert torch.equal(fused(x), F.relu(stock(x)))
    assert not applies(x.double(), mine.weight) and not applies(x.half(), mine.weight)
    assert not applies(x[0], mine.weight)  # 3-D
    assert not applies(x, mine.weight.to(torch.bfloat16))
    fused.train()
    y = fused(x.half())  # stock path (fp16 values), still right
    assert y.dtype == torch.float16 and bool((y >= 0).all())
    assert _rel(y, F.relu(stock.train()(x.half()))) < 1e-2


def test_state_dict_and_parameters_are_the_batch_norms_own() -> None:
    bn = nn.BatchNorm2d(5)
    fused = FusedBatchNorm2d.from_batch_norm(bn, relu=True)
    assert fused.weight is bn.weight and fused.running_mean is bn.running_mean
    assert list(fused.state_dict()) == list(bn.state_dict())
    assert isinstance(fused, nn.BatchNorm2d) and "relu=True" in repr(fused)


class Block(nn.Module):
    """A ResNet block's shape: bn -> relu, bn + shortcut (computed after it) -> relu, a
    batch norm whose output is used twice (not fusable), functional and method ReLUs."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.conv2, self.bn2 = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.short, self.bn3 = nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4)
        self.bn4 = nn.BatchNorm2d(4)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += self.bn3(self.short(x))  # the shortcut comes after bn2 in the graph
        out = F.relu(out)
        twice = self.bn4(out)
        return twice.relu() + twice


def test_fx_rewrite_fuses_relu_and_add_relu_and_trains_as_stock() -> None:
    torch.manual_seed(0)
    model = Block()
    fused, summary = fuse_batch_norm(copy.deepcopy(model))
    assert summary.traced and isinstance(fused, fx.GraphModule)
    assert (summary.batch_norms, summary.with_relu, summary.with_add_relu) == (4, 1, 1)
    assert {n for n, _ in fused.named_parameters()} == {n for n, _ in model.named_parameters()}
    x = torch.randn(3, 4, 6, 6)
    ya, yb = model(x), fused(x)
    ya.sum().backward()
    yb.sum().backward()
    assert _rel(yb, ya) < 1e-5
    grads = dict(fused.named_parameters())
    names = [n for n, _ in model.named_parameters()]
    # all together (a conv bias right before a batch norm has a zero gradient in exact arithmetic)
    assert _rel(torch.cat([grads[n].grad.flatten() for n in names]),
                torch.cat([p.grad.flatten() for _, p in model.named_parameters()])) < 1e-5
    assert "FusedBatchNorm2d" in type(fused.get_submodule("bn2")).__name__


class Untraceable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if float(x.mean()) > 100.0:  # data-dependent control flow: fx cannot trace it
            return x
        return self.body(x)


def test_untraceable_model_keeps_its_forward_and_swaps_modules() -> None:
    model = Untraceable()
    out, summary = fuse_batch_norm(model)
    assert out is model and not summary.traced and "cannot trace" in summary.describe()
    assert summary.batch_norms == 1 and summary.with_relu == 0
    assert isinstance(model.body[1], FusedBatchNorm2d) and not model.body[1].relu
    y = model(torch.randn(2, 3, 8, 8))
    assert y.shape == (2, 4, 6, 6) and bool((y >= 0).all())


def test_compiles_as_one_opaque_op_without_graph_breaks() -> None:
    compiler = pytest.importorskip("torch._dynamo")
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
    fused, _ = fuse_batch_norm(copy.deepcopy(model))
    explained = compiler.explain(fused)(torch.randn(2, 3, 8, 8))
    assert explained.graph_break_count == 0


def test_a_kernel_is_built_again_when_a_header_it_includes_changes(tmp_path, monkeypatch) -> None:
    from profilednn.kernels import build

    monkeypatch.setenv("PROFILEDNN_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "shared.h").write_text("#define SCALE 2\n")
    source = tmp_path / "k.c"
    source.write_text('#include "shared.h"\nint scaled(int x) { return SCALE * x; }\n')
    first = build.build(source)
    assert build.build(source) == first  # cached
    (tmp_path / "shared.h").write_text("#define SCALE 3\n")
    second = build.build(source)
    assert second != first and second.is_file()

"""profilednn.kernels.sigmoid_focal_loss against torchvision's, float64 truth and gradcheck."""

from __future__ import annotations

import pytest
import torch

torchvision = pytest.importorskip("torchvision", reason="needs the [zoo] extra (pip install 'profilednn[zoo]')")

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


@pytest.mark.parametrize("backend", ["native", "torch"])
def test_forward_matches_float64_truth_as_well_as_torchvision(backend):
    x, y = _data(scale=8.0, positive=0.3)
    truth = REFERENCE(x.double(), y.double())
    ours = sigmoid_focal_loss(x, y, backend=backend).double()
    ours_err = (ours - truth).abs().max()
    ref_err = (REFERENCE(x, y).double() - truth).abs().max()
    assert ours_err <= ref_err * 1.5 + 1e-12  # fp32 rounding of a few products, like torchvision's
    assert _close(ours, truth, rtol=2e-6)


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


# ----------------------------------------------------------------------------- the C kernel
def assert_native_close_to_float64(x, y, alpha, gamma, reduction, rtol=1e-5):
    """The native kernel's loss and gradient against torchvision computed in float64."""
    xa = x.clone().requires_grad_()
    ours = sigmoid_focal_loss(xa, y, alpha=alpha, gamma=gamma, reduction=reduction, backend="native")
    xd = x.double().requires_grad_()
    truth = REFERENCE(xd, y.double(), alpha=alpha, gamma=gamma, reduction=reduction)
    upstream = torch.randn(truth.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    (ours * upstream.float()).sum().backward()
    (truth * upstream).sum().backward()
    assert _close(ours.detach().double(), truth.detach(), rtol=rtol)
    assert _close(xa.grad.double(), xd.grad, rtol=rtol)


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("alpha,gamma", SETTINGS)
def test_native_values_and_grads_within_1e5_of_float64(reduction, alpha, gamma):
    x, y = _data(scale=6.0, positive=0.3)
    assert_native_close_to_float64(x, y, alpha, gamma, reduction)


def test_native_soft_targets_and_many_threaded_blocks():
    # 3 x 50,000 elements: 37 blocks of 4096, run on PyTorch's threads; soft targets.
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 5000, 10, generator=g) * 5
    y = torch.rand(3, 5000, 10, generator=g)
    assert_native_close_to_float64(x, y, 0.25, 2.0, "sum")


def test_native_sum_is_the_same_for_any_thread_count():
    x, y = _data(shape=(4, 9000, 3), positive=0.01)
    prev = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = sigmoid_focal_loss(x, y, reduction="sum", backend="native")
        torch.set_num_threads(2)
        two = sigmoid_focal_loss(x, y, reduction="sum", backend="native")
    finally:
        torch.set_num_threads(prev)
    assert one.item() == two.item()


def test_native_backward_scales_by_the_incoming_gradient_and_survives_retain_graph():
    x, y = _data()
    xa = x.clone().requires_grad_()
    loss = sigmoid_focal_loss(xa, y, reduction="mean", backend="native")
    (grad_once,) = torch.autograd.grad(loss * 3.0, xa, retain_graph=True)
    (grad_again,) = torch.autograd.grad(loss * 3.0, xa)  # the saved gradient was handed over: recomputed
    xb = x.clone().requires_grad_()
    (REFERENCE(xb, y, reduction="mean") * 3.0).backward()
    assert _close(grad_once, xb.grad) and torch.equal(grad_once, grad_again)


def test_native_without_grad_writes_no_gradient():
    x, y = _data()
    with torch.no_grad():
        loss = sigmoid_focal_loss(x.requires_grad_(), y, reduction="sum", backend="native")
    assert not loss.requires_grad and _close(loss, REFERENCE(x.detach(), y, reduction="sum"))


def test_native_bf16_logits_and_targets():
    x, y = _data(shape=(3, 4000), positive=0.05)
    xb = x.to(torch.bfloat16).requires_grad_()
    loss = sigmoid_focal_loss(xb, y.to(torch.bfloat16), reduction="none", backend="native")
    assert loss.dtype == torch.float32
    loss.sum().backward()
    assert xb.grad.dtype == torch.bfloat16
    x64 = xb.detach().double().requires_grad_()  # the same (rounded) values
    truth = REFERENCE(x64, y.double(), reduction="none")
    truth.sum().backward()
    assert _close(loss.detach().double(), truth.detach(), rtol=1e-5)
    # the gradient is rounded once to bf16 (8 bits of mantissa)
    assert _close(xb.grad.double(), x64.grad, rtol=2 ** -8)


def test_native_bf16_logits_keep_soft_fp32_targets_exact():
    x, y = _data()
    y = torch.rand(y.shape, generator=torch.Generator().manual_seed(2))  # not representable in bf16
    xb = x.to(torch.bfloat16).requires_grad_()
    loss = sigmoid_focal_loss(xb, y, reduction="sum", backend="native")
    loss.backward()
    truth = REFERENCE(xb.detach().double(), y.double(), reduction="sum")
    assert loss.item() == pytest.approx(truth.item(), rel=1e-5) and xb.grad.dtype == torch.bfloat16


def test_native_propagates_nan_logits():
    x = torch.tensor([0.5, float("nan"), -2.0]).requires_grad_()
    for gamma in (0.0, 2.0):
        loss = sigmoid_focal_loss(x, torch.tensor([1.0, 0.0, 0.0]), gamma=gamma, reduction="none", backend="native")
        (grad,) = torch.autograd.grad(loss.sum(), x)
        assert torch.isnan(loss[1]) and torch.isnan(grad[1])
        assert torch.isfinite(loss[[0, 2]]).all() and torch.isfinite(grad[[0, 2]]).all()


def test_backend_choice():
    x, y = _data()
    with pytest.raises(ValueError, match="backend"):
        sigmoid_focal_loss(x, y, backend="cuda")
    with pytest.raises(ValueError, match="fp32 or bf16"):
        sigmoid_focal_loss(x.double(), y.double(), backend="native")
    # A gradient for the targets: auto takes the PyTorch-ops path, which computes it.
    yt = torch.rand(y.shape, generator=torch.Generator().manual_seed(4)).requires_grad_()
    sigmoid_focal_loss(x, yt, reduction="sum").backward()
    assert yt.grad is not None and torch.isfinite(yt.grad).all()
    with pytest.raises(ValueError, match="targets"):
        sigmoid_focal_loss(x, yt, backend="native")


def test_without_a_compiler_auto_warns_and_falls_back_native_raises(tmp_path, monkeypatch):
    from profilednn.kernels import focal_loss as module
    from profilednn.kernels.bindings import focal_loss_kernel
    from profilednn.kernels.build import NativeKernelUnavailable

    monkeypatch.setenv("PROFILEDNN_CACHE_DIR", str(tmp_path))  # nothing built there yet
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setattr(module, "_native_error", None)
    focal_loss_kernel.cache_clear()
    try:
        x, y = _data()
        with pytest.warns(RuntimeWarning, match="native kernel is unavailable"):
            loss = sigmoid_focal_loss(x, y, reduction="sum")
        assert _close(loss, REFERENCE(x, y, reduction="sum"))
        with pytest.raises(NativeKernelUnavailable, match="no-such-cc"):
            sigmoid_focal_loss(x, y, backend="native")
    finally:
        focal_loss_kernel.cache_clear()


def _topology(*isa: str):
    from profilednn.topology import CpuTopology

    return CpuTopology(model_name="injected", cores=(), isa=frozenset(isa))


def _run_library(path, x: torch.Tensor, y: torch.Tensor) -> tuple[float, torch.Tensor]:
    """Load a separately built kernel library and run one fused pass (sum, gradient)."""
    import ctypes

    lib = ctypes.CDLL(str(path))
    lib.profilednn_focal_loss_blocks.restype = ctypes.c_int64
    lib.profilednn_focal_loss_blocks.argtypes = [ctypes.c_int64]
    fn = lib.profilednn_focal_loss
    p, f = ctypes.c_void_p, ctypes.c_float
    fn.argtypes = [ctypes.c_int64, p, p, ctypes.c_int, f, f, f, p, p, p, ctypes.c_int]
    sums = torch.empty(lib.profilednn_focal_loss_blocks(x.numel()), dtype=torch.float64)
    grad = torch.empty_like(x)
    fn(x.numel(), x.data_ptr(), y.data_ptr(), 0, 0.25, 2.0, 1.0, sums.data_ptr(), None, grad.data_ptr(), 1)
    return float(sums.sum()), grad


def test_isa_flags_follow_the_topology():
    from profilednn.kernels.build import isa_flags

    assert isa_flags(_topology("sse4_2")) == []
    assert isa_flags(_topology("avx", "avx2", "fma")) == ["-mavx2", "-mfma"]
    assert isa_flags(_topology("avx2", "fma", "avx512f", "avx512bw", "avx512vl")) == [
        "-mavx2", "-mfma", "-mavx512f", "-mavx512bw", "-mavx512vl"]


@pytest.mark.real_cpu  # compares the build's flags with the silicon's
def test_an_injected_cpu_does_not_change_what_is_built(monkeypatch):
    # PROFILEDNN_CPU_FLAGS asks "what if" for advice; a kernel must still run on this silicon.
    from profilednn.kernels.build import isa_flags
    from profilednn.topology import detected_topology

    monkeypatch.setenv("PROFILEDNN_CPU_FLAGS", "+avx512f,+avx512bw,+avx512vl,-avx2")
    assert isa_flags() == isa_flags(detected_topology())


# This CPU's own build is exercised by every test above; here the portable baseline and
# the AVX-512 build (compiled everywhere, run only on a CPU that has AVX-512).
@pytest.mark.real_cpu  # runs the AVX-512 build only where the silicon has it
@pytest.mark.parametrize("isa", [(), ("avx2", "fma", "avx512f", "avx512bw", "avx512vl")],
                         ids=["baseline", "avx512"])
def test_kernel_builds_for_each_isa_and_runs_where_the_cpu_has_it(isa, tmp_path, monkeypatch):
    from profilednn.kernels.bindings import FOCAL_LOSS_SOURCE
    from profilednn.kernels.build import build
    from profilednn.topology import detected_topology

    monkeypatch.setenv("PROFILEDNN_CACHE_DIR", str(tmp_path))
    path = build(FOCAL_LOSS_SOURCE, topology=_topology(*isa))
    assert path.parent == tmp_path / "kernels" and path.stat().st_size > 0
    have = detected_topology().isa
    if not set(isa) <= have:
        pytest.skip(f"built; this CPU lacks {sorted(set(isa) - have)} to run it")
    x, y = _data(shape=(5, 1000), positive=0.1)
    total, grad = _run_library(path, x, y)
    xr = x.clone().requires_grad_()
    ref = REFERENCE(xr, y, reduction="sum")
    ref.backward()
    assert total == pytest.approx(ref.item(), rel=1e-5) and _close(grad, xr.grad)


def test_native_gradient_buffer_is_recycled_once_dropped_never_while_held():
    from profilednn.kernels import release_gradient_buffers

    release_gradient_buffers()
    x, y = _data(shape=(2, 3000, 7))

    def grad_of(scale: float) -> torch.Tensor:
        xa = (x * scale).requires_grad_()
        sigmoid_focal_loss(xa, y, reduction="sum", backend="native").backward()
        return xa.grad

    held = grad_of(1.0)
    kept = held.clone()
    other = grad_of(2.0)  # `held` is alive: another buffer
    assert other.data_ptr() != held.data_ptr()
    address = other.data_ptr()
    del other
    again = grad_of(3.0)  # the dropped one comes back, and autograd took it as .grad without a copy
    assert again.data_ptr() == address
    assert torch.equal(held, kept)  # the held gradient was never written
    xr = (x * 3.0).requires_grad_()
    REFERENCE(xr, y, reduction="sum").backward()
    assert _close(again, xr.grad)
    assert release_gradient_buffers() == 2


def test_gradient_pool_sizes_capacity_and_release():
    from profilednn.kernels.buffers import GradientPool

    pool = GradientPool(capacity=2)
    a = pool.take((4, 5), torch.float32)
    assert a.shape == (4, 5) and a.is_contiguous()
    ptr = a.data_ptr()
    del a
    assert pool.take((3, 5), torch.float32).data_ptr() == ptr  # smaller fits (within 2x)
    assert pool.take((2, 5), torch.bfloat16).data_ptr() != ptr  # another dtype: a new buffer
    assert pool.take((100,), torch.float32).data_ptr() != ptr  # larger: a new buffer
    assert len(pool._buffers) == 2  # capacity: the least recently used was dropped
    assert pool.take((1,), torch.float32).numel() == 1  # far smaller than any: not handed a 100
    assert pool.held_bytes() > 0 and pool.release() == 2 and pool.held_bytes() == 0
    assert pool.take((0, 3), torch.float32).shape == (0, 3) and pool.release() == 0

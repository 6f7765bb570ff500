"""FusedLAMB against the per-parameter ReferenceLAMB, and the reference against the paper."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from profilednn.kernels import FusedLAMB, ReferenceLAMB


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    # No bias before the batch norm: its gradient would be pure rounding noise, which LAMB's
    # trust ratio (||x|| / ||u||) blows up to full-size steps in a random direction.
    return nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                         nn.Linear(8 * 6 * 6, 5))


def _groups(model: nn.Module) -> list[dict]:
    decay = [p for n, p in model.named_parameters() if p.dim() > 1]
    no_decay = [p for n, p in model.named_parameters() if p.dim() <= 1]
    return [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}]


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    g = torch.Generator().manual_seed(7)
    for _ in range(steps):
        x = torch.randn(4, 3, 8, 8, generator=g)
        y = torch.randint(0, 5, (4,), generator=g)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


BACKENDS = [("native", 1 << 20), ("foreach", 1 << 20), ("foreach", 37)]


@pytest.mark.parametrize("backend,block_elements", BACKENDS)
def test_fused_trains_like_reference_within_1e6(backend, block_elements):
    a, b = _model(), _model()
    ref = ReferenceLAMB(_groups(a), lr=1e-2, betas=(0.9, 0.99), eps=1e-6)
    fused = FusedLAMB(_groups(b), lr=1e-2, betas=(0.9, 0.99), eps=1e-6, block_elements=block_elements,
                      backend=backend)
    _train(a, ref, 6)
    _train(b, fused, 6)
    assert fused.backend_used == backend
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(p, q, rtol=1e-6, atol=1e-6), name
        assert ref.state[p]["step"] == fused.state[q]["step"] == 6


@pytest.mark.parametrize("backend,block_elements", BACKENDS)
def test_fused_step_equals_reference_step_within_1e6(backend, block_elements):
    """Same gradients into both (no training feedback): parameters and both moments agree."""
    g = torch.Generator().manual_seed(11)
    shapes = [(64, 3, 3, 3), (64,), (40000,), (10, 5), (1,)]  # one above the parallel threshold
    init = [torch.randn(s, generator=g) for s in shapes]
    a = [nn.Parameter(x.clone()) for x in init]
    b = [nn.Parameter(x.clone()) for x in init]
    groups = lambda ps: [{"params": ps[:3], "weight_decay": 0.01}, {"params": ps[3:], "weight_decay": 0.0}]
    ref = ReferenceLAMB(groups(a), lr=1e-2, betas=(0.9, 0.99), eps=1e-6)
    fused = FusedLAMB(groups(b), lr=1e-2, betas=(0.9, 0.99), eps=1e-6, block_elements=block_elements,
                      backend=backend)
    for _ in range(5):
        for p, q in zip(a, b):
            p.grad = torch.randn(p.shape, generator=g) * 0.1
            q.grad = p.grad.clone()
        ref.step()
        fused.step()
    for p, q in zip(a, b):
        # Within 1e-6 of the tensor's scale: m averages random signs, so single elements sit
        # near 0 where an element-wise relative test would measure cancellation, not LAMB.
        for key, x, y in [("param", p.detach(), q.detach())] + [(k, ref.state[p][k], fused.state[q][k])
                                              for k in ("exp_avg", "exp_avg_sq")]:
            assert float((x - y).abs().max()) <= 1e-6 * float(x.abs().max()), key


def test_reference_follows_the_paper_for_one_tensor():
    torch.manual_seed(3)
    x0 = torch.randn(5, dtype=torch.float64)
    grads = [torch.randn(5, dtype=torch.float64) for _ in range(3)]
    lr, b1, b2, eps, wd = 0.1, 0.9, 0.999, 1e-6, 0.01
    p = nn.Parameter(x0.clone())
    opt = ReferenceLAMB([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    x, m, v = x0.tolist(), [0.0] * 5, [0.0] * 5
    for t, g in enumerate(grads, start=1):
        p.grad = g.clone()
        opt.step()
        gl = g.tolist()
        m = [b1 * mi + (1 - b1) * gi for mi, gi in zip(m, gl)]
        v = [b2 * vi + (1 - b2) * gi * gi for vi, gi in zip(v, gl)]
        r = [(mi / (1 - b1**t)) / (math.sqrt(vi / (1 - b2**t)) + eps) for mi, vi in zip(m, v)]
        u = [ri + wd * xi for ri, xi in zip(r, x)]
        trust = math.sqrt(sum(xi * xi for xi in x)) / math.sqrt(sum(ui * ui for ui in u))
        x = [xi - lr * trust * ui for xi, ui in zip(x, u)]
    assert p.detach().tolist() == pytest.approx(x, rel=1e-12, abs=1e-12)


def test_zero_weights_use_trust_ratio_one_and_no_grad_is_skipped():
    zero = nn.Parameter(torch.zeros(4))
    idle = nn.Parameter(torch.ones(3))
    ref_zero, ref_idle = nn.Parameter(torch.zeros(4)), nn.Parameter(torch.ones(3))
    fused = FusedLAMB([zero, idle], lr=0.5)
    ref = ReferenceLAMB([ref_zero, ref_idle], lr=0.5)
    zero.grad = torch.tensor([1.0, -2.0, 3.0, 0.5])
    ref_zero.grad = zero.grad.clone()
    fused.step()
    ref.step()
    assert torch.allclose(zero, ref_zero, atol=1e-7)
    assert zero.abs().sum() > 0  # ||x|| = 0: the step uses trust ratio 1 instead of 0
    assert torch.equal(idle, torch.ones(3)) and idle not in fused.state


def test_state_dict_and_deepcopy_round_trip():
    a = _model()
    opt = FusedLAMB(_groups(a), lr=1e-2)
    _train(a, opt, 2)
    b = copy.deepcopy(a)
    opt_b = FusedLAMB(_groups(b), lr=1e-2)
    opt_b.load_state_dict(copy.deepcopy(opt.state_dict()))  # torch shares the tensors otherwise
    _train(a, opt, 2)
    _train(b, opt_b, 2)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
    model_copy, opt_copy = copy.deepcopy((a, opt))
    assert opt_copy.param_groups[0]["params"][0] is next(model_copy.parameters())


def test_bad_hyperparameters():
    p = [nn.Parameter(torch.ones(2))]
    for kwargs in ({"lr": -1.0}, {"betas": (1.0, 0.9)}, {"eps": 0.0}, {"weight_decay": -0.1}):
        with pytest.raises(ValueError):
            FusedLAMB(p, **kwargs)
        with pytest.raises(ValueError):
            ReferenceLAMB(p, **kwargs)
    with pytest.raises(ValueError, match="block_elements"):
        FusedLAMB(p, block_elements=0)


def test_channels_last_parameters_and_grads_of_other_strides_match_reference():
    torch.manual_seed(1)
    base = torch.randn(4, 3, 5, 5)
    a = nn.Parameter(base.clone())
    b = nn.Parameter(base.clone().to(memory_format=torch.channels_last))
    ref = ReferenceLAMB([a], lr=1e-2, weight_decay=0.01)
    fused = FusedLAMB([b], lr=1e-2, weight_decay=0.01, block_elements=64)
    for step in range(3):
        g = torch.randn(4, 3, 5, 5)
        a.grad = g.clone()
        # A contiguous gradient on a channels-last parameter on odd steps.
        b.grad = g.clone() if step % 2 else g.clone().to(memory_format=torch.channels_last)
        ref.step()
        fused.step()
    assert b.is_contiguous(memory_format=torch.channels_last)
    assert torch.allclose(a, b, rtol=1e-6, atol=1e-6)


def test_non_dense_parameter_is_refused_with_its_strides():
    p = nn.Parameter(torch.randn(4, 6)[:, ::2])
    p.grad = torch.ones_like(p)
    with pytest.raises(RuntimeError, match="dense"):
        FusedLAMB([p]).step()


def test_native_kernel_is_built_into_the_cache_dir(tmp_path, monkeypatch):
    from profilednn.kernels.bindings import LAMB_SOURCE
    from profilednn.kernels.build import build

    monkeypatch.setenv("PROFILEDNN_CACHE_DIR", str(tmp_path))
    path = build(LAMB_SOURCE)
    assert path.parent == tmp_path / "kernels" and path.suffix == ".so" and path.stat().st_size > 0
    assert build(LAMB_SOURCE) == path  # cached: the same build, not a second one
    assert [p.name for p in (tmp_path / "kernels").iterdir()] == [path.name]  # no temporaries left


def test_without_a_compiler_auto_warns_and_falls_back_native_raises(tmp_path, monkeypatch):
    from profilednn.kernels.bindings import lamb_kernel
    from profilednn.kernels.build import NativeKernelUnavailable

    monkeypatch.setenv("PROFILEDNN_CACHE_DIR", str(tmp_path))  # nothing built there yet
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    lamb_kernel.cache_clear()
    try:
        p = nn.Parameter(torch.ones(3))
        p.grad = torch.full((3,), 0.5)
        opt = FusedLAMB([p], lr=0.1)
        with pytest.warns(RuntimeWarning, match="native kernel is unavailable"):
            opt.step()
        assert opt.backend_used == "foreach" and p[0].item() < 1.0
        with pytest.raises(NativeKernelUnavailable, match="no-such-cc"):
            FusedLAMB([p], backend="native").step()
    finally:
        lamb_kernel.cache_clear()


def test_backend_choice_is_checked():
    p = nn.Parameter(torch.ones(3, dtype=torch.float64))
    p.grad = torch.ones(3, dtype=torch.float64)
    with pytest.raises(ValueError, match="backend"):
        FusedLAMB([p], backend="cuda")
    with pytest.raises(RuntimeError, match="fp32 CPU"):
        FusedLAMB([p], backend="native").step()
    opt = FusedLAMB([p])  # auto: float64 takes the multi-tensor path
    opt.step()
    assert opt.backend_used == "foreach"


def test_native_step_is_repeatable_and_the_same_for_any_thread_count():
    """One parallel region for the whole step: large tensors split across threads (norms
    summed in thread order), small ones dealt round robin; pass 2 walks backwards."""
    g = torch.Generator().manual_seed(5)
    shapes = [(70001,), (3, 5), (40000, 2), (7,), (33000,)]  # large, small, large, small, large
    init = [torch.randn(s, generator=g) for s in shapes]
    grads = [torch.randn(s, generator=g) * 0.1 for s in shapes]

    def run(threads: int) -> list[torch.Tensor]:
        ps = [nn.Parameter(x.clone()) for x in init]
        opt = FusedLAMB(ps, lr=1e-2, weight_decay=0.01, backend="native")
        prev = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            for _ in range(3):
                for p, gr in zip(ps, grads):
                    p.grad = gr.clone()
                opt.step()
        finally:
            torch.set_num_threads(prev)
        return [p.detach() for p in ps]

    ref = ReferenceLAMB([nn.Parameter(x.clone()) for x in init], lr=1e-2, weight_decay=0.01)
    for _ in range(3):
        for p, gr in zip(ref.param_groups[0]["params"], grads):
            p.grad = gr.clone()
        ref.step()
    one, two, two_again = run(1), run(2), run(2)
    for a, b, c, r in zip(one, two, two_again, ref.param_groups[0]["params"]):
        assert torch.equal(b, c)  # the same thread count gives the same bits
        assert float((a - b).abs().max()) <= 1e-6 * float(a.abs().max())
        assert float((b - r.detach()).abs().max()) <= 1e-6 * float(r.detach().abs().max())


def test_the_old_import_path_still_works_and_says_where_lamb_moved(monkeypatch):
    import importlib
    import sys

    monkeypatch.delitem(sys.modules, "profilednn.optim", raising=False)
    with pytest.warns(DeprecationWarning, match="profilednn.kernels"):
        old = importlib.import_module("profilednn.optim")
    assert old.FusedLAMB is FusedLAMB and old.ReferenceLAMB is ReferenceLAMB

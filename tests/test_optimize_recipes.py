"""Each recipe's apply/skip logic, and what applying it changes (tiny models, no timing)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torchvision = pytest.importorskip("torchvision", reason="needs the [zoo] extra (pip install 'profilednn[zoo]')")
from torchvision.ops.misc import FrozenBatchNorm2d  # noqa: E402

from profilednn.errors import InputError
from profilednn.kernels import sigmoid_focal_loss
from profilednn.kernels import FusedLAMB, ReferenceLAMB
from profilednn.optimization import RECIPES, Context, TrainStep, load_recipes, select_recipes
from profilednn.optimization.frozen import ConvFrozenBN2d, FusedFrozenBatchNorm2d, conv_bn_pairs
from profilednn.optimization.precision import NOT_NATIVE
from profilednn.topology import Core, CpuTopology, cpu_topology
from profilednn.workloads import RetinaNetLoss

load_recipes()


def ctx(isa: frozenset[str] | None = None, peaks: dict[str, float] | None = None) -> Context:
    if isa is None:
        return Context(cpu_topology(), gemm_peaks=peaks)
    cores = (Core(socket=0, core=0, node=0, cpus=(0,)), Core(socket=0, core=1, node=0, cpus=(1,)))
    return Context(CpuTopology(model_name="test cpu", cores=cores, isa=isa), gemm_peaks=peaks)


def cnn_setup(optimizer=torch.optim.SGD, **opt_kwargs) -> TrainStep:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                          nn.Linear(4 * 6 * 6, 3))
    batch = (torch.randn(2, 3, 6, 6), torch.tensor([0, 2]))
    opt = optimizer(model.parameters(), lr=0.1, **opt_kwargs)
    return TrainStep(model, opt, nn.CrossEntropyLoss(), [batch])


def mlp_setup() -> TrainStep:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 2))
    return TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(),
                      [(torch.randn(3, 5), torch.tensor([0, 1, 1]))])


class FrozenNet(nn.Module):
    """conv -> FrozenBN -> relu (frozen conv), conv -> FrozenBN (trainable), a lone FrozenBN."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.stem_bn = FrozenBatchNorm2d(4)
        self.body = nn.Conv2d(4, 4, 3, padding=1, bias=True)
        self.body_bn = FrozenBatchNorm2d(4)
        self.lone_bn = FrozenBatchNorm2d(4)
        self.head = nn.Linear(4, 2)
        for bn in (self.stem_bn, self.body_bn, self.lone_bn):
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
        self.stem.weight.requires_grad_(False)

    def forward(self, x):
        x = torch.relu(self.stem_bn(self.stem(x)))
        x = self.lone_bn(torch.relu(self.body_bn(self.body(x))))
        return self.head(x.mean((2, 3)))


def frozen_setup() -> TrainStep:
    torch.manual_seed(0)
    model = FrozenNet()
    params = [p for p in model.parameters() if p.requires_grad]
    return TrainStep(model, torch.optim.SGD(params, lr=0.1), nn.CrossEntropyLoss(),
                      [(torch.randn(2, 3, 8, 8), torch.tensor([1, 0]))])


# ------------------------------------------------------------------------- registry
def test_registry_order_and_selection():
    names = list(load_recipes())
    assert names[:3] == ["frozen_weight_grads", "frozen_batchnorm", "fused_loss"]
    assert names[-2:] == ["threads", "allocator"] and "torch_compile" in names
    picked = select_recipes("channels_last,fused_optimizer")  # run in registry order
    assert [r.name for r in picked] == ["fused_optimizer", "channels_last"]
    with pytest.raises(InputError, match="unknown recipe"):
        select_recipes(["channels_last", "warp_drive"])
    with pytest.raises(InputError):
        select_recipes("")


# ------------------------------------------------------------------------- layout, dtype
def test_channels_last_applies_to_cnns_only():
    recipe = RECIPES["channels_last"]
    assert "no 2-D convolution" in recipe.check(mlp_setup(), ctx())
    setup = cnn_setup()
    assert recipe.check(setup, ctx()) is None
    optimizer_params = setup.optimizer.param_groups[0]["params"]
    recipe.apply(setup, ctx())
    conv = setup.model[0]
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert conv.weight is optimizer_params[0]  # same Parameter: the optimizer still trains it
    assert setup.channels_last and "already" in recipe.check(setup, ctx())


@pytest.mark.cpu_facing
def test_dtype_policy_needs_bf16_to_pay(inject_cpu):
    recipe = RECIPES["dtype_policy"]
    reason = recipe.check(cnn_setup(), ctx(frozenset({"avx2", "fma"})))
    assert NOT_NATIVE in reason
    vector = frozenset({"avx2", "avx512_bf16"})  # native BF16 without a matrix unit: measure first
    assert "no bf16 GEMM peak was measured" in recipe.check(cnn_setup(), ctx(vector))
    assert "(0.91x)" in recipe.check(cnn_setup(), ctx(vector, {"fp32": 375.0, "bf16": 341.0}))
    setup = cnn_setup()
    assert recipe.check(setup, ctx(vector, {"fp32": 201.0, "bf16": 437.0})) is None  # Zen 4's peaks
    recipe.apply(setup, ctx(vector))
    assert setup.autocast_dtype == torch.bfloat16
    outputs = setup.forward(setup.batches[0][0])
    assert outputs.dtype == torch.float32  # the loss is computed in fp32
    assert "already" in recipe.check(setup, ctx(frozenset({"amx_bf16"})))
    inject_cpu("-avx512_bf16,-amx_bf16")  # the detected CPU, whatever it is, without BF16
    assert NOT_NATIVE in recipe.check(cnn_setup(), ctx())
    inject_cpu("+amx_bf16")  # and with a matrix unit for it
    assert recipe.check(cnn_setup(), ctx()) is None


# ------------------------------------------------------------------------- optimizers
def test_fused_optimizer_plans():
    recipe = RECIPES["fused_optimizer"]
    setup = cnn_setup(momentum=0.9)
    setup.run()  # momentum state exists
    state_before = {p: s["momentum_buffer"] for p, s in setup.optimizer.state.items()}
    assert recipe.check(setup, ctx()) is None
    assert "fused=True" in recipe.apply(setup, ctx())
    assert all(g["fused"] for g in setup.optimizer.param_groups)
    assert setup.optimizer.param_groups[0]["momentum"] == 0.9
    assert all(setup.optimizer.state[p]["momentum_buffer"] is buf for p, buf in state_before.items())
    assert "already" in recipe.check(setup, ctx())

    rms = cnn_setup(torch.optim.RMSprop)
    recipe.apply(rms, ctx())
    assert all(g["foreach"] for g in rms.optimizer.param_groups)

    lamb = cnn_setup(ReferenceLAMB)
    recipe.apply(lamb, ctx())
    assert isinstance(lamb.optimizer, FusedLAMB) and lamb.optimizer.param_groups[0]["lr"] == 0.1

    class Custom(torch.optim.SGD):
        pass

    assert "no fused or multi-tensor implementation" in recipe.check(cnn_setup(Custom), ctx())


# ------------------------------------------------------------------------- frozen layers
def test_frozen_batchnorm_folds_exactly():
    recipe = RECIPES["frozen_batchnorm"]
    assert "no torchvision FrozenBatchNorm2d" in recipe.check(cnn_setup(), ctx())
    stock, folded = frozen_setup(), frozen_setup()
    assert sorted(conv_bn_pairs(folded.model, folded.batches[0][0])) == [("body", "body_bn"), ("stem", "stem_bn")]
    assert recipe.check(folded, ctx()) is None
    how = recipe.apply(folded, ctx())
    assert "2 of 3" in how and "1 of those convolutions frozen" in how
    assert isinstance(folded.model.stem, ConvFrozenBN2d) and isinstance(folded.model.body, ConvFrozenBN2d)
    assert isinstance(folded.model.lone_bn, FusedFrozenBatchNorm2d)
    assert isinstance(folded.model.stem_bn, nn.Identity)
    assert dict(stock.model.named_parameters()).keys() == dict(folded.model.named_parameters()).keys()
    x, y = stock.batches[0]
    outs = []
    for setup in (stock, folded):
        out = setup.model(x)
        nn.functional.cross_entropy(out, y).backward()
        outs.append(out)
    assert torch.allclose(outs[0], outs[1], rtol=1e-5, atol=1e-6)
    for name in ("body.weight", "body.bias", "head.weight"):
        g_stock = dict(stock.model.named_parameters())[name].grad
        g_fold = dict(folded.model.named_parameters())[name].grad
        assert torch.allclose(g_stock, g_fold, rtol=1e-4, atol=1e-6), name
    assert folded.model.stem.weight.grad is None  # frozen: no weight gradient


def test_conv_read_twice_is_not_folded():
    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 3, 1)
            self.bn = FrozenBatchNorm2d(3)
            self.other = nn.ReLU()

        def forward(self, x):
            y = self.conv(x)
            return self.bn(y) + self.other(y)

    assert conv_bn_pairs(Shared(), torch.randn(1, 3, 4, 4)) == []


def test_frozen_weight_grads():
    recipe = RECIPES["frozen_weight_grads"]
    assert "nothing is frozen" in recipe.check(cnn_setup(), ctx())
    assert "already done" in recipe.check(frozen_setup(), ctx())
    setup = cnn_setup()
    head = setup.model[4]
    setup.optimizer = torch.optim.SGD([
        {"params": list(setup.model[0].parameters()) + list(setup.model[1].parameters())},
        {"params": list(head.parameters()), "lr": 0.0},
    ], lr=0.1)
    assert recipe.check(setup, ctx()) is None
    assert "2 parameter tensors" in recipe.apply(setup, ctx())
    assert not head.weight.requires_grad and setup.model[0].weight.requires_grad
    setup.run()
    assert head.weight.grad is None and setup.model[0].weight.grad is not None


# ------------------------------------------------------------------------- loss, compile
def test_fused_loss_swaps_torchvision_focal_loss():
    recipe = RECIPES["fused_loss"]
    assert "does not call" in recipe.check(cnn_setup(), ctx())
    setup = cnn_setup()
    setup.loss_fn = RetinaNetLoss()
    assert setup.loss_fn.focal_loss is torchvision.ops.sigmoid_focal_loss
    assert recipe.check(setup, ctx()) is None
    assert "RetinaNetLoss.focal_loss" in recipe.apply(setup, ctx())
    assert setup.loss_fn.focal_loss is sigmoid_focal_loss
    bare = cnn_setup()
    bare.loss_fn = torchvision.ops.sigmoid_focal_loss
    recipe.apply(bare, ctx())
    assert bare.loss_fn is sigmoid_focal_loss


def test_torch_compile_check():
    recipe = RECIPES["torch_compile"]
    setup = cnn_setup()
    from profilednn.optimization.compile import compiler_missing

    assert recipe.check(setup, ctx()) == compiler_missing()
    setup.compiled = True
    assert "already compiled" in recipe.check(setup, ctx())


def test_torch_compile_keeps_max_pools_on_aten():
    from profilednn.kernels import AtenMaxPool2d
    from profilednn.optimization.compile import compiler_missing

    if compiler_missing():
        pytest.skip(compiler_missing())
    setup = cnn_setup()
    setup.model.insert(3, nn.MaxPool2d(3, 1, 1))  # keeps the 6x6 map: the head still fits
    said = RECIPES["torch_compile"].apply(setup, ctx())
    assert said.startswith("model = torch.compile(model)") and "1 nn.MaxPool2d kept on ATen's kernels" in said
    assert setup.compiled and isinstance(setup.model._orig_mod[3], AtenMaxPool2d)
    assert "MaxPool2d" not in RECIPES["torch_compile"].apply(cnn_setup(), ctx())  # none to keep


def pointwise_setup() -> TrainStep:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 1), nn.ReLU(), nn.Conv2d(8, 4, 3, padding=1), nn.Conv2d(4, 4, 1, stride=2),
                          nn.Flatten(), nn.Linear(4 * 3 * 3, 3))
    batch = (torch.randn(2, 3, 6, 6), torch.tensor([0, 2]))
    return TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), [batch])


def test_pointwise_gemm_needs_trainable_pointwise_convolutions_on_channels_last():
    from profilednn.kernels import PointwiseGemmConv2d

    recipe = RECIPES["pointwise_gemm"]
    assert "no trainable 1x1" in recipe.check(cnn_setup(), ctx())  # a 3x3 convolution only
    setup = pointwise_setup()
    assert "NCHW" in recipe.check(setup, ctx())
    RECIPES["channels_last"].apply(setup, ctx())
    assert recipe.check(setup, ctx()) is None
    weight = setup.model[0].weight
    said = recipe.apply(setup, ctx())
    assert said.startswith("2 1x1 Conv2d -> PointwiseGemmConv2d") and "1 other convolutions stay stock" in said
    assert isinstance(setup.model[0], PointwiseGemmConv2d) and setup.model[0].weight is weight
    assert weight is setup.optimizer.param_groups[0]["params"][0]  # the optimizer still trains it
    before = weight.detach().clone()
    losses = [setup.run().loss for _ in range(2)]
    assert all(map(math.isfinite, losses)) and not torch.equal(weight, before)  # trained through the GEMM
    frozen = pointwise_setup()
    RECIPES["channels_last"].apply(frozen, ctx())
    for conv in (frozen.model[0], frozen.model[3]):
        conv.weight.requires_grad_(False)
    assert "no trainable 1x1" in recipe.check(frozen, ctx())
    frozen.compiled = True
    assert "already compiled" in recipe.check(frozen, ctx())


# ------------------------------------------------------------------------- process, data
@pytest.mark.cpu_facing
def test_threads_and_allocator_set_the_environment():
    threads = RECIPES["threads"]
    setup = cnn_setup()
    threads.apply(setup, ctx())
    cores = str(cpu_topology().physical_cores)  # one thread per physical core, whatever the CPU
    assert setup.env["OMP_NUM_THREADS"] == cores and setup.env["OMP_PROC_BIND"] == "close"
    assert threads.fresh_process and RECIPES["allocator"].fresh_process


@pytest.mark.parametrize("installed", [("jemalloc", "/opt/lib/libjemalloc.so.2"),
                                       ("tcmalloc", "/opt/lib/libtcmalloc_minimal.so.4"), None])
def test_allocator_prefers_jemalloc_then_tcmalloc_then_tuned_glibc(monkeypatch, installed):
    from profilednn.optimization import process

    monkeypatch.setattr(process, "find_allocator", lambda: installed)
    monkeypatch.setattr(process, "is_glibc", lambda: True)
    monkeypatch.setattr(process, "transparent_huge_pages", lambda: installed is None)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.cpu.x86_shstk=on:glibc.malloc.mmap_max=5")
    allocator = RECIPES["allocator"]
    setup = cnn_setup()
    assert allocator.check(setup, ctx()) is None
    how = allocator.apply(setup, ctx())
    if installed is None:
        tunables = setup.env["GLIBC_TUNABLES"].split(":")
        assert "LD_PRELOAD" not in setup.env and "apt-get install" in how
        # the user's own tunable kept, their mmap_max replaced (not duplicated)
        assert tunables[0] == "glibc.cpu.x86_shstk=on" and tunables.count("glibc.malloc.mmap_max=0") == 1
        assert not any(t == "glibc.malloc.mmap_max=5" for t in tunables)
        assert setup.env["THP_MEM_ALLOC_ENABLE"] == "1"
        assert "already keeps freed memory" in allocator.check(setup, ctx())
    else:
        assert "THP_MEM_ALLOC_ENABLE" not in setup.env and "GLIBC_TUNABLES" not in setup.env
        assert setup.env["LD_PRELOAD"] == installed[1] and ("MALLOC_CONF" in setup.env) == (installed[0] == "jemalloc")
        assert "already preloaded" in allocator.check(setup, ctx())


def test_allocator_needs_glibc_when_nothing_is_installed(monkeypatch):
    from profilednn.optimization import process

    monkeypatch.setattr(process, "find_allocator", lambda: None)
    monkeypatch.setattr(process, "is_glibc", lambda: False)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    reason = RECIPES["allocator"].check(cnn_setup(), ctx())
    assert "neither jemalloc nor tcmalloc" in reason and "not glibc" in reason


PAGE_FAULTS = """
import resource, torch
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
x = torch.ones(16 * 2**20)  # 64 MiB: above glibc's largest mmap threshold
del x
before = faults()
for _ in range(5):
    y = torch.ones(16 * 2**20)
    del y
print(faults() - before)
"""


def test_glibc_tunables_of_the_recipe_stop_large_buffers_faulting_back_in():
    """The mechanism the glibc branch rests on: without it every 64 MiB buffer is mapped
    afresh and page-faulted in (16k faults each); with it the freed heap is reused."""
    import subprocess
    import sys

    from profilednn.optimization.process import GLIBC_CACHING, glibc_tunables, is_glibc

    if not is_glibc():
        pytest.skip("GLIBC_TUNABLES is glibc's")

    def faults(env_extra: dict[str, str]) -> int:
        import os

        env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "GLIBC_TUNABLES", "MALLOC_MMAP_MAX_")}
        out = subprocess.run([sys.executable, "-c", PAGE_FAULTS], env={**env, **env_extra, "OMP_NUM_THREADS": "1"},
                             capture_output=True, text=True, check=True)
        return int(out.stdout.strip())

    default = faults({})
    # 2 MiB alignment as THP_MEM_ALLOC_ENABLE=1 asks of PyTorch (without it glibc reuses a
    # 64-byte-aligned block only now and then)
    tuned = faults({"GLIBC_TUNABLES": glibc_tunables("", GLIBC_CACHING), "THP_MEM_ALLOC_ENABLE": "1"})
    assert default > 5 * 8000, default  # 5 buffers of 16k 4 KiB pages, each faulted in again
    assert tuned < default / 20, (tuned, default)  # reused: a few pages fault, not every buffer


def test_dataloader_workers():
    recipe = RECIPES["dataloader_workers"]
    assert "no DataLoader" in recipe.check(cnn_setup(), ctx())
    data = TensorDataset(torch.randn(8, 3, 6, 6), torch.randint(0, 3, (8,)))
    setup = cnn_setup()
    setup.data_loader = DataLoader(data, batch_size=4, shuffle=False)
    assert recipe.check(setup, ctx()) is None
    first = setup.next_batch()
    assert "num_workers 0 -> 1" in recipe.apply(setup, ctx())
    assert setup.data_loader.num_workers == 1
    again = setup.next_batch()
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])


# ------------------------------------------------------------------------- fused dropout
def _encoder_setup(kdim: int | None = None, dropout: float = 0.1) -> TrainStep:
    torch.manual_seed(0)
    if kdim is None:
        layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=dropout, batch_first=True)
        model = nn.Sequential(nn.Dropout(dropout), nn.TransformerEncoder(layer, 1, enable_nested_tensor=False),
                              nn.Flatten(), nn.Linear(16 * 5, 3))
    else:  # an attention with separate k/v projections, no dropout module
        model = nn.MultiheadAttention(16, 2, dropout=dropout, kdim=kdim, vdim=kdim, batch_first=True)
    batch = (torch.randn(2, 5, 16), torch.tensor([0, 2]))
    return TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), [batch])


def test_fused_dropout_applies_to_dropout_modules_and_attention():
    from profilednn.kernels.dropout import native_available
    from profilednn.kernels.dropout_fusion import FusedDropoutAttention

    recipe = RECIPES["fused_dropout"]
    assert recipe.random_stream and recipe.changes_arithmetic
    setup = _encoder_setup()
    if not native_available():
        assert "cannot be built" in recipe.check(setup, ctx())
        return
    assert recipe.check(setup, ctx()) is None
    said = recipe.apply(setup, ctx())
    assert said.startswith("4 nn.Dropout -> FusedDropout, 1 nn.MultiheadAttention")
    assert sum(isinstance(m, FusedDropoutAttention) for m in setup.model.modules()) == 1
    assert "no dropout with p > 0" in recipe.check(setup, ctx())  # nothing stock left
    assert setup.run().loss > 0


def test_fused_dropout_does_not_apply_without_dropout():
    recipe = RECIPES["fused_dropout"]
    assert "no dropout with p > 0" in recipe.check(cnn_setup(), ctx())
    assert "no dropout with p > 0" in recipe.check(_encoder_setup(dropout=0.0), ctx())
    assert "separate k/v projections" in recipe.check(_encoder_setup(kdim=8), ctx())
    compiled = _encoder_setup()
    compiled.compiled = True
    assert "already compiled" in recipe.check(compiled, ctx())

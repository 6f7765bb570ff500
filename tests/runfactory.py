"""Build realistic Runs for the analysis and report tests (docs/run-format.md exactly).

A tiny ResNet-like model (conv1, bn1, relu, layer1.0.{conv1,bn1,relu,conv2,bn2},
head.cls_logits) trains for a few synthetic steps on a synthetic clock: framework op
events nest like torch.profiler's (aten::conv2d > ... > aten::mkldnn_convolution with
oneDNN primitives inside), backward runs through autograd engine nodes, the optimizer
through ``Optimizer.step#SGD.step``. Op times follow simple cost models (convolution
FLOPs at 20 GFLOP/s, elementwise bytes at 10 GB/s, a few microseconds of dispatch), so
shares behave like a real Run's: more classes make the head and the loss heavier.

``RunSpec()`` is a clean Run on which no advice rule fires; each knob turns one
finding on.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator

import polars as pl

from profilednn.run import Run, create_run
from profilednn.tables import LAYERS, OP_EVENTS, OPS, PRIMITIVES, SPANS, STEPS

T0 = 1_795_317_249_000.0  # epoch ms
FLOP_PER_MS = 2e7  # 20 GFLOP/s
BYTES_PER_MS = 1e7  # 10 GB/s
DISPATCH_MS = 0.002
ANCHORS = 9


@dataclass(frozen=True)
class RunSpec:
    """Knobs of a synthetic Run; the defaults make a Run no advice rule fires on."""

    steps: int = 3
    mb: int = 4
    image: int = 32
    channels: int = 16
    num_classes: int = 10
    workload: str = "tiny_resnet"
    layout: str = "nhwc"  # nchw: plain activations, reordered around every convolution
    reorder_scale: float = 1.0  # multiplies the cost of activation reorders
    dtype: str = "f32"  # bf16: oneDNN bf16 primitives and BFloat16 ops
    native_bf16: bool = False
    loss_fp32: bool = False  # with dtype bf16: the loss ops take Float (autocast done right)
    frozen_bn: bool = False  # torchvision FrozenBatchNorm2d (mul + add) instead of BatchNorm2d
    bn_scale: float = 1.0  # multiplies the cost of the (trainable) batch norms, forward and backward
    loss: str = "cross_entropy"  # focal: a composed sigmoid focal loss over anchors x classes
    optimizer: str = "foreach"  # per_param | foreach | fused
    optimizer_scale: float = 1.0  # multiplies the optimizer ops' cost
    frozen_layers: tuple[str, ...] = ()  # trainable_params = 0
    frozen_wgrad: bool = False  # frozen layers still run BWD_W (the library discrepancy)
    not_optimized: tuple[str, ...] = ()  # trainable but no optimizer updates them
    threads: int = 2
    cores: int = 2
    allocator: str = "default"
    allocations_per_step: int = 200
    mapped_alloc_mib: float | None = None  # MiB a step above glibc's mmap threshold (None: an older Run)
    page_faults: dict | None = None  # manifest["page_faults"] as capture writes it (None: not counted)
    data_ms: float = 0.05
    fragment_ops: int = 0  # a chain of tiny ops in head.post during forward
    native_conv: tuple[str, ...] = ()  # 1x1 convs PyTorch ran in _slow_conv2d_* (no oneDNN)
    pointwise: tuple[str, ...] = ()  # convolutions that are 1x1 without padding (oneDNN primitives)
    pointwise_wgrad_scale: float = 1.0  # multiplies the cost of the 1x1 convolutions' BWD_W primitives
    dropout_scale: float = 0.0  # > 0: layer1.0.drop after layer1.0.relu; its mask (bernoulli_) costs this many passes
    dropout_type: str = "Dropout"  # FusedDropout: the fused kernel's module (its own ops, no bernoulli_)
    attention_dropout: str = ""  # a module type (e.g. MultiheadAttention): layer1.0.attn with dropout in its forward
    attention_dropout_scale: float = 1.0  # the cost of layer1.0.attn's mask, in elementwise passes
    attention_sdpa: bool = False  # layer1.0.attn's work inside F.scaled_dot_product_attention's math path
    light: bool = False  # no ops / op_events (``--light`` capture)
    status: str = "complete"
    extra_fingerprint: dict = field(default_factory=dict)
    optimizers: tuple[dict, ...] = ()  # manifest["optimizers"] records, as capture writes them
    script_argv: tuple[str, ...] = ()  # a script Run (``profile -- python train.py ...``)


# ------------------------------------------------------------------------- the model
@dataclass(frozen=True)
class Module:
    path: str
    type: str
    ic: int = 0
    oc: int = 0
    k: int = 3
    bias: bool = False


def model(spec: RunSpec) -> list[Module]:
    c = spec.channels
    bn = "FrozenBatchNorm2d" if spec.frozen_bn else "BatchNorm2d"

    def k(path: str) -> int:
        return 1 if path in spec.pointwise else 3

    mods = [
        Module("conv1", "Conv2d", 3, c, k("conv1")),
        Module("bn1", bn, c, c),
        Module("relu", "ReLU", c, c),
        Module("layer1.0.conv1", "Conv2d", c, c, k("layer1.0.conv1")),
        Module("layer1.0.bn1", bn, c, c),
        Module("layer1.0.relu", "ReLU", c, c),
        *([Module("layer1.0.drop", spec.dropout_type, c, c)] if spec.dropout_scale else []),
        *([Module("layer1.0.attn", spec.attention_dropout, c, c)] if spec.attention_dropout else []),
        Module("layer1.0.conv2", "Conv2d", c, c, k("layer1.0.conv2")),
        Module("layer1.0.bn2", bn, c, c),
        Module("head.cls_logits", "Conv2d", c, ANCHORS * spec.num_classes, k("head.cls_logits"), bias=True),
    ]
    if spec.fragment_ops:
        mods.append(Module("head.post", "AnchorDecoder", 0, 0))
    return mods


def params_of(m: Module) -> int:
    if m.type == "Conv2d":
        return m.oc * m.ic * m.k * m.k + (m.oc if m.bias else 0)
    if m.type == "BatchNorm2d":
        return 2 * m.oc
    return 0  # FrozenBatchNorm2d keeps its affine terms as buffers


def param_tensors(m: Module) -> list[int]:
    if m.type == "Conv2d":
        return [m.oc * m.ic * m.k * m.k] + ([m.oc] if m.bias else [])
    if m.type == "BatchNorm2d":
        return [m.oc, m.oc]
    return []


# ------------------------------------------------------------------------- the clock
class Timeline:
    """Records op events, primitives and spans while advancing a synthetic clock."""

    def __init__(self, spec: RunSpec):
        self.spec = spec
        self.t = T0
        self.step: int | None = None
        self.phase: str | None = None
        self.mod_stack: list[Module] = []
        self.op_stack: list[dict] = []
        self.events: list[dict] = []
        self.prims: list[dict] = []
        self.spans: list[dict] = []
        self.line = 0

    @property
    def module(self) -> Module | None:
        return self.mod_stack[-1] if self.mod_stack else None

    @contextlib.contextmanager
    def phase_span(self, phase: str) -> Iterator[None]:
        self.phase, start = phase, self.t
        yield
        self.spans.append(
            {"kind": "phase", "name": phase, "module_type": None, "phase": phase, "step": self.step,
             "start_ms": start, "end_ms": self.t, "depth": 0}
        )
        self.phase = None

    @contextlib.contextmanager
    def module_span(self, path: str, mtype: str, mod: Module | None = None) -> Iterator[None]:
        self.mod_stack.append(mod or Module(path, mtype))
        start = self.t
        yield
        self.mod_stack.pop()
        self.spans.append(
            {"kind": "module", "name": path, "module_type": mtype, "phase": self.phase, "step": self.step,
             "start_ms": start, "end_ms": self.t, "depth": path.count(".") + 1}
        )

    @contextlib.contextmanager
    def op(self, name: str, shapes: str = "[]") -> Iterator[dict]:
        mod = self.module
        in_loss = mod is not None and mod.path == "loss"
        dtype = "BFloat16" if self.spec.dtype == "bf16" and not (in_loss and self.spec.loss_fp32) else "Float"
        ev = {
            "op": name, "start_ms": self.t, "tid": 1, "depth": len(self.op_stack),
            "input_shapes": shapes, "dtypes": f"[{dtype}]",
            "module": mod.path if mod else None, "module_type": mod.type if mod else None,
            "phase": self.phase, "step": self.step, "_children": 0.0, "_onednn": 0.0,
        }
        self.op_stack.append(ev)
        self.t += DISPATCH_MS
        yield ev
        self.t += DISPATCH_MS / 2
        self.op_stack.pop()
        ev["dur_ms"] = self.t - ev["start_ms"]
        ev["self_ms"] = ev["dur_ms"] - ev["_children"]
        if self.op_stack:
            self.op_stack[-1]["_children"] += ev["dur_ms"]
        self.events.append(ev)

    def leaf(self, name: str, ms: float, shapes: str = "[]") -> None:
        with self.op(name, shapes):
            self.t += ms

    def gap(self, ms: float = 0.003) -> None:
        self.t += ms

    def prim(self, ms: float, **fields: object) -> None:
        self.line += 1
        mod = self.module
        row = {
            "line": self.line, "dialect": "onednn_v3.6", "event": "exec", "engine": "cpu",
            "timestamp_ms": self.t, "time_ms": ms,
            "op": self.op_stack[-1]["op"] if self.op_stack else None,
            "module": mod.path if mod else None, "phase": self.phase, "step": self.step,
        }
        row.update(fields)
        self.prims.append(row)
        if self.op_stack:
            self.op_stack[-1]["_onednn"] += ms
        self.t += ms


# ------------------------------------------------------------------------- cost models
def ew_ms(elements: int) -> float:
    return elements * 12 / BYTES_PER_MS


def act_elements(spec: RunSpec, c: int) -> int:
    return spec.mb * c * spec.image * spec.image


def conv_fields(spec: RunSpec, m: Module) -> dict[str, object]:
    h, p = spec.image, (m.k - 1) // 2  # "same" padding: 1 for 3x3, none for 1x1
    return {
        "mb": spec.mb, "g": 1, "ic": m.ic, "oc": m.oc, "ih": h, "iw": h, "oh": h, "ow": h,
        "kh": m.k, "kw": m.k, "sh": 1, "sw": 1, "dh": 0, "dw": 0, "ph": p, "pw": p,
        "problem": f"mb{spec.mb}_ic{m.ic}oc{m.oc}_ih{h}oh{h}kh{m.k}sh1dh0ph{p}_iw{h}ow{h}kw{m.k}sw1dw0pw{p}",
        "flops": 2.0 * spec.mb * m.oc * m.ic * m.k * m.k * h * h,
    }


def conv_ms(spec: RunSpec, m: Module) -> float:
    return 2.0 * spec.mb * m.oc * m.ic * m.k * m.k * spec.image**2 / FLOP_PER_MS


# ------------------------------------------------------------------------- one Run
class Builder:
    def __init__(self, spec: RunSpec):
        self.spec = spec
        self.tl = Timeline(spec)
        self.mods = model(spec)
        self.dt = "bf16" if spec.dtype == "bf16" else "f32"
        self.plain = "abcd" if spec.layout == "nchw" else "acdb"

    # -- primitives ------------------------------------------------------------------
    def _prim_common(self, m: Module) -> dict[str, object]:
        return {"cfg": self.dt, "src_dt": self.dt, "wei_dt": self.dt, "dst_dt": self.dt, **conv_fields(self.spec, m)}

    def reorder(self, src: str, dst: str, dims: str, ms: float) -> None:
        self.tl.prim(
            ms, driver="reorder", prim_kind="reorder", impl="jit:blk", isa="avx2", prop_kind="undef",
            direction=None, cfg=self.dt, src_dt=self.dt, dst_dt=self.dt, src_tag=src, dst_tag=dst,
            dims=dims, problem=dims, bytes=float(ms * BYTES_PER_MS),
        )

    def conv_prim(self, m: Module, direction: str, prop: str, ms: float) -> None:
        blocked = self.spec.layout == "nchw"
        impl = {"FWD_B": "fwd", "BWD_D": "bwd_d", "BWD_W": "bwd_w"}[direction]
        self.tl.prim(
            ms, driver="conv", prim_kind="convolution",
            impl=f"jit:avx2" if blocked else f"brg_conv_{impl}:avx2", isa="avx2", prop_kind=prop,
            direction=direction, src_tag=("abcd" if m.ic == 3 or not blocked else "aBcd8b") if blocked else "acdb",
            wei_tag="Acdb8a", dst_tag="aBcd8b" if blocked else "acdb", alg="convolution_direct",
            **self._prim_common(m),
        )

    def act_reorders(self, m: Module, c: int, to_blocked: bool) -> None:
        if self.spec.layout != "nchw" or c == 3:
            return
        dims = f"{self.spec.mb}x{c}x{self.spec.image}x{self.spec.image}"
        ms = ew_ms(act_elements(self.spec, c)) * 0.5 * self.spec.reorder_scale
        src, dst = ("abcd", "aBcd8b") if to_blocked else ("aBcd8b", "abcd")
        self.reorder(src, dst, dims, ms)

    def weight_reorder(self, m: Module, to_blocked: bool) -> None:
        dims = f"{m.oc}x{m.ic}x{m.k}x{m.k}"
        ms = m.oc * m.ic * m.k * m.k * 8 / BYTES_PER_MS
        src, dst = (self.plain, "Acdb8a") if to_blocked else ("Acdb8a", self.plain)
        self.reorder(src, dst, dims, ms)

    # -- forward ---------------------------------------------------------------------
    def forward(self, m: Module) -> None:
        tl, spec = self.tl, self.spec
        shape = f"[[{spec.mb}, {m.ic}, {spec.image}, {spec.image}]]"
        if m.type == "Conv2d" and m.path in spec.native_conv:
            full = f"[[{spec.mb}, {m.ic}, {spec.image}, {spec.image}], [{m.oc}, {m.ic}, 1, 1]]"
            with tl.op("aten::conv2d", full), tl.op("aten::convolution", full), \
                    tl.op("aten::_convolution", full), tl.op("aten::thnn_conv2d", full):
                tl.leaf("aten::_slow_conv2d_forward", 2 * conv_ms(spec, m), full)
        elif m.type == "Conv2d":
            with tl.op("aten::conv2d", shape), tl.op("aten::convolution", shape), \
                    tl.op("aten::_convolution", shape), tl.op("aten::mkldnn_convolution", shape):
                tl.leaf("aten::empty", 0.001)
                self.weight_reorder(m, True)
                self.act_reorders(m, m.ic, True)
                self.conv_prim(m, "FWD_B", "forward_training", conv_ms(spec, m))
                self.act_reorders(m, m.oc, False)
        elif m.type == "BatchNorm2d":
            with tl.op("aten::batch_norm", shape), tl.op("aten::_batch_norm_impl_index", shape), \
                    tl.op("aten::native_batch_norm", shape):
                tl.t += 2 * spec.bn_scale * ew_ms(act_elements(spec, m.oc))
        elif m.type == "FrozenBatchNorm2d":
            for name in ("aten::add", "aten::rsqrt", "aten::mul", "aten::mul", "aten::sub"):
                tl.leaf(name, 0.001, f"[[{m.oc}]]")
                tl.gap()
            tl.leaf("aten::mul", ew_ms(act_elements(spec, m.oc)), shape)
            tl.gap()
            tl.leaf("aten::add", ew_ms(act_elements(spec, m.oc)), shape)
        elif m.type == "ReLU":
            with tl.op("aten::relu", shape):
                tl.leaf("aten::clamp_min", ew_ms(act_elements(spec, m.oc)), shape)
        elif m.type == "AnchorDecoder":
            for i in range(spec.fragment_ops):
                tl.leaf(("aten::mul", "aten::add", "aten::exp", "aten::sub")[i % 4], 0.004)
                tl.gap(0.004)
        elif m.path == "layer1.0.drop" and m.type in ("FusedDropout", "FusedDropoutAttention"):
            tl.leaf("profilednn::dropout_forward", ew_ms(act_elements(spec, m.oc)), shape)
        elif m.path == "layer1.0.drop":
            self.dropout(shape, m, spec.dropout_scale)
        elif m.path == "layer1.0.attn":
            with contextlib.ExitStack() as sdpa:
                if spec.attention_sdpa:
                    sdpa.enter_context(tl.op("aten::scaled_dot_product_attention", shape))
                    sdpa.enter_context(tl.op("aten::_scaled_dot_product_attention_math", shape))
                tl.leaf("aten::_softmax", ew_ms(act_elements(spec, m.oc)), shape)
                self.dropout(shape, m, spec.attention_dropout_scale)
                tl.leaf("aten::bmm", ew_ms(act_elements(spec, m.oc)), shape)
        tl.gap()

    def dropout(self, shape: str, m: Module, scale: float) -> None:
        """Stock dropout on a CPU: ``aten::dropout`` drawing the mask with ``bernoulli_``
        (``scale`` elementwise passes), then dividing and multiplying."""
        tl, n = self.tl, act_elements(self.spec, m.oc)
        with tl.op("aten::dropout", shape):
            tl.leaf("aten::empty_like", 0.001, shape)
            tl.leaf("aten::bernoulli_", scale * ew_ms(n), shape)
            tl.leaf("aten::div_", ew_ms(n), shape)
            tl.leaf("aten::mul", ew_ms(n), shape)

    # -- backward --------------------------------------------------------------------
    def node(self, name: str) -> contextlib.AbstractContextManager:
        return _nested(self.tl, f"autograd::engine::evaluate_function: {name}", name)

    def accumulate(self, n: int) -> None:
        for _ in range(n):
            with self.tl.op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"), \
                    self.tl.op("torch::autograd::AccumulateGrad"):
                self.tl.leaf("aten::detach", 0.001)
            self.tl.gap()

    def backward(self, m: Module, first: bool) -> None:
        tl, spec = self.tl, self.spec
        frozen = m.path in spec.frozen_layers
        if m.type == "Conv2d" and m.path in spec.native_conv:
            act = f"[{spec.mb}, {m.ic}, {spec.image}, {spec.image}]"
            full = f"[[{spec.mb}, {m.oc}, {spec.image}, {spec.image}], {act}, [{m.oc}, {m.ic}, 1, 1]]"
            with self.node("ConvolutionBackward0"), tl.op("aten::convolution_backward", full):
                tl.leaf("aten::_slow_conv2d_backward", 4 * conv_ms(spec, m), full)
            if not frozen:
                self.accumulate(len(param_tensors(m)))
        elif m.type == "Conv2d":
            with self.node("ConvolutionBackward0"), tl.op("aten::convolution_backward"):
                self.act_reorders(m, m.oc, True)
                if not first:
                    self.conv_prim(m, "BWD_D", "backward_data", conv_ms(spec, m))
                    self.act_reorders(m, m.ic, False)
                if not frozen or spec.frozen_wgrad:
                    scale = spec.pointwise_wgrad_scale if m.k == 1 else 1.0
                    self.conv_prim(m, "BWD_W", "backward_weights", conv_ms(spec, m) * scale)
                    self.weight_reorder(m, False)
            if not frozen:
                self.accumulate(len(param_tensors(m)))
        elif m.type == "BatchNorm2d":
            with self.node("NativeBatchNormBackward0"), tl.op("aten::native_batch_norm_backward"):
                tl.t += 3 * spec.bn_scale * ew_ms(act_elements(spec, m.oc))
            if not frozen:
                self.accumulate(2)
        elif m.type == "FrozenBatchNorm2d":
            with self.node("AddBackward0"):
                pass
            with self.node("MulBackward0"):
                tl.leaf("aten::mul", ew_ms(act_elements(spec, m.oc)))
        elif m.type == "ReLU":
            with self.node("ReluBackward0"):
                tl.leaf("aten::threshold_backward", ew_ms(act_elements(spec, m.oc)))
        elif m.path == "layer1.0.drop" and m.type in ("FusedDropout", "FusedDropoutAttention"):
            with self.node("DropoutForwardBackward"):
                tl.leaf("profilednn::dropout_backward", ew_ms(act_elements(spec, m.oc)))
        elif m.path in ("layer1.0.drop", "layer1.0.attn"):
            with self.node("MulBackward0"):
                tl.leaf("aten::mul", ew_ms(act_elements(spec, m.oc)))
        tl.gap()

    # -- loss, optimizer -------------------------------------------------------------
    def loss_elements(self) -> int:
        return self.spec.mb * self.spec.image**2 * ANCHORS * self.spec.num_classes

    FOCAL_FWD = ("aten::sigmoid", "aten::binary_cross_entropy_with_logits", "aten::mul", "aten::rsub",
                 "aten::mul", "aten::add", "aten::pow", "aten::mul", "aten::mul", "aten::add")
    FOCAL_BWD = ("aten::mul", "aten::mul", "aten::pow", "aten::mul", "aten::sub", "aten::mul", "aten::add",
                 "aten::sigmoid_backward", "aten::mul", "aten::mul", "aten::add", "aten::mul", "aten::neg",
                 "aten::mul", "aten::add")

    def loss_forward(self) -> None:
        tl = self.tl
        if self.spec.loss == "focal":
            n = self.loss_elements()
            for name in self.FOCAL_FWD:
                tl.leaf(name, ew_ms(n))
                tl.gap()
            tl.leaf("aten::sum", ew_ms(n) / 3)
        else:
            with tl.op("aten::cross_entropy_loss"):
                tl.leaf("aten::_log_softmax", 0.004)
                tl.leaf("aten::nll_loss_forward", 0.003)

    def loss_backward(self) -> None:
        tl = self.tl
        if self.spec.loss == "focal":
            n = self.loss_elements()
            for name in self.FOCAL_BWD:
                with self.node("MulBackward0"):
                    tl.leaf(name, ew_ms(n))
                tl.gap()
        else:
            with self.node("NllLossBackward0"):
                tl.leaf("aten::nll_loss_backward", 0.004)
            with self.node("LogSoftmaxBackward0"):
                tl.leaf("aten::_log_softmax_backward_data", 0.004)

    def optimizer_step(self) -> None:
        tl, spec = self.tl, self.spec
        sizes = [n for m in self.mods if m.path not in spec.frozen_layers for n in param_tensors(m)]
        scale = spec.optimizer_scale
        with tl.op("Optimizer.step#SGD.step"):
            if spec.optimizer == "per_param":
                for n in sizes:
                    for name in ("aten::mul_", "aten::add_", "aten::add_"):
                        tl.leaf(name, ew_ms(n) * scale + 0.001)
                        tl.gap(0.002)
            elif spec.optimizer == "foreach":
                for name in ("aten::_foreach_mul_", "aten::_foreach_add_", "aten::_foreach_add_"):
                    tl.leaf(name, sum(ew_ms(n) for n in sizes) * scale + 0.002)
            else:
                tl.leaf("aten::_fused_sgd_", sum(ew_ms(n) for n in sizes) * scale * 1.5 + 0.002)
        with tl.op("Optimizer.zero_grad#SGD.zero_grad"):
            tl.t += 0.005

    # -- a step ----------------------------------------------------------------------
    def step(self, index: int | None) -> dict[str, object]:
        tl, spec = self.tl, self.spec
        tl.step = index  # None: a warm-up step
        start = tl.t
        phase_ms: dict[str, float] = {}

        def timed(phase: str):
            return _Timed(tl, phase, phase_ms)

        with timed("data"), tl.module_span("data", "DataLoader"):
            tl.leaf("aten::normal_", spec.data_ms)
        with timed("forward"):
            self._walk(self.mods, self.forward)
        with timed("loss"), tl.module_span("loss", "SigmoidFocalLoss" if spec.loss == "focal" else "CrossEntropyLoss"):
            self.loss_forward()
        with timed("backward"):
            # as in a capture: the loss's backward runs before the first layer's backward
            # hook fires, so it belongs to no module span
            self.loss_backward()
            rev = list(reversed(self.mods))
            self._walk(rev, lambda m: self.backward(m, first=m.path == "conv1"))
        with timed("optimizer"), tl.module_span("optimizer", "SGD"):
            self.optimizer_step()
        tl.gap(0.01)
        return {
            "step": index, "time_ms": tl.t - start, "loss": 2.3 - 0.1 * (index or 0),
            **{f"{p}_ms": phase_ms.get(p, 0.0) for p in ("data", "forward", "loss", "backward", "optimizer")},
            "other_ms": 0.0,
            "allocations": None if spec.light else spec.allocations_per_step,
            "mapped_alloc_mib": None if spec.light else spec.mapped_alloc_mib,
        }

    def _walk(self, mods: list[Module], visit) -> None:
        """Visit leaf modules in order, opening and closing parent module spans."""
        open_parents: list[tuple[str, contextlib.ExitStack]] = []
        for m in mods:
            parents = [".".join(m.path.split(".")[:i]) for i in range(1, m.path.count(".") + 1)]
            while open_parents and open_parents[-1][0] not in parents:
                open_parents.pop()[1].close()
            for p in parents:
                if p not in [q for q, _ in open_parents]:
                    stack = contextlib.ExitStack()
                    stack.enter_context(self.tl.module_span(p, "Sequential" if p.count(".") == 0 else "BasicBlock"))
                    open_parents.append((p, stack))
            with self.tl.module_span(m.path, m.type, m):
                visit(m)
        while open_parents:
            open_parents.pop()[1].close()

    # -- tables ----------------------------------------------------------------------
    def build(self) -> dict[str, pl.DataFrame]:
        self.step(None)  # warm-up
        warm_prims = self.tl.prims  # kept with a null step, as a capture may keep them
        self.tl.prims, self.tl.events, self.tl.spans = [], [], []
        steps = [self.step(i) for i in range(self.spec.steps)]
        self.tl.prims = warm_prims + self.tl.prims
        tables = {
            PRIMITIVES.name: self._primitives(),
            STEPS.name: STEPS.frame(steps),
            LAYERS.name: self._layers(),
            SPANS.name: SPANS.frame(self.tl.spans),
        }
        if not self.spec.light:
            events = pl.DataFrame(self.tl.events, schema_overrides={"step": pl.Int64}).sort("start_ms")
            tables[OP_EVENTS.name] = events.select(*OP_EVENTS.schema)
            tables[OPS.name] = (
                events.group_by(["op", "module", "module_type", "phase", "input_shapes", "dtypes", "step"])
                .agg(calls=pl.len(), self_time_ms=pl.col("self_ms").sum(), total_time_ms=pl.col("dur_ms").sum(),
                     onednn_ms=pl.col("_onednn").sum())
                .sort(["step", "op", "module"], nulls_last=True)
            )
        return tables

    def _primitives(self) -> pl.DataFrame:
        schema = PRIMITIVES.schema
        prims = self.tl.prims
        if self.spec.light:
            prims = [{**p, "op": None} for p in prims]
        return pl.DataFrame(prims, schema=schema)

    def _layers(self) -> pl.DataFrame:
        spans = pl.DataFrame(self.tl.spans).filter(pl.col("kind") == "module")
        by_path = {m.path: m for m in self.mods}
        rows = (
            spans.group_by(["name", "module_type", "phase", "step"])
            .agg(calls=pl.len(), time_ms=(pl.col("end_ms") - pl.col("start_ms")).sum())
            .rename({"name": "module"})
        )
        pseudo = {"loss", "optimizer", "data"}
        rows = rows.with_columns(
            phase=pl.when(pl.col("module").is_in(list(pseudo)) & (pl.col("phase") != "backward"))
            .then(pl.col("module")).otherwise(pl.col("phase"))
        )
        # forward/backward for modules; the pseudo-module's own phase otherwise
        params = {p: params_of(m) for p, m in by_path.items()}
        trainable = {p: 0 if p in self.spec.frozen_layers else n for p, n in params.items()}
        optimized = {p: 0 if p in self.spec.not_optimized else n for p, n in trainable.items()}
        module = pl.col("module")
        rows = rows.with_columns(
            params=module.replace_strict(params, default=0, return_dtype=pl.Int64),
            trainable_params=module.replace_strict(trainable, default=0, return_dtype=pl.Int64),
            leaf=module.is_in(list(by_path)) | module.is_in(list(pseudo)),
        )
        if self.spec.not_optimized:
            rows = rows.with_columns(
                optimized_params=module.replace_strict(optimized, default=0, return_dtype=pl.Int64)
            )
        return rows.sort(["step", "module", "phase"])


class _Timed:
    def __init__(self, tl: Timeline, phase: str, out: dict[str, float]):
        self.tl, self.phase, self.out = tl, phase, out
        self.cm = tl.phase_span(phase)

    def __enter__(self):
        self.start = self.tl.t
        self.cm.__enter__()

    def __exit__(self, *exc):
        self.cm.__exit__(*exc)
        self.out[self.phase] = self.out.get(self.phase, 0.0) + self.tl.t - self.start


@contextlib.contextmanager
def _nested(tl: Timeline, outer: str, inner: str) -> Iterator[None]:
    with tl.op(outer), tl.op(inner):
        yield


def fingerprint(spec: RunSpec) -> dict[str, object]:
    # native BF16 here is an AMX CPU's: BF16 pays there without a measured peak (topology.dtype_speed)
    flags = ["sse4_1", "avx", "avx2", "fma"] + (["avx512f", "avx512_bf16", "amx_tile", "amx_bf16"]
                                                if spec.native_bf16 else [])
    fp = {
        "cpu_model": "AMD EPYC (synthetic)", "cores": spec.cores, "sockets": 1, "numa_nodes": 1,
        "isa_flags": flags, "native_bf16": spec.native_bf16, "torch": "2.14.1", "onednn": "3.12.0",
        "threads": spec.threads, "interop_threads": 1, "allocator": spec.allocator,
        "env": {"OMP_NUM_THREADS": str(spec.threads)},
    }
    fp.update(spec.extra_fingerprint)
    return fp


def make_run(runs_dir: Path, spec: RunSpec | None = None, **knobs: object) -> Run:
    """Write a complete Run built from ``spec`` (or ``RunSpec(**knobs)``) under ``runs_dir``."""
    spec = replace(spec or RunSpec(), **knobs)  # type: ignore[arg-type]
    workload: dict[str, object] = {"kind": "builtin", "name": spec.workload,
                                   "config": {"num_classes": spec.num_classes, "batch_size": spec.mb}}
    command = ["profilednn", "profile", spec.workload]
    if spec.script_argv:
        workload = {"kind": "script", "name": spec.script_argv[-1], "argv": list(spec.script_argv)}
        command = ["profilednn", "profile", "--", *spec.script_argv]
    run = create_run(
        runs_dir, label=spec.workload,
        command=command,
        workload=workload,
        fingerprint=fingerprint(spec),
        capture={"light": spec.light, "warmup": 1, "steps": spec.steps},
        notes=[],
    )
    for name, df in Builder(spec).build().items():
        run.write_table(name, df)
    run.update(steps=spec.steps)
    if spec.optimizers:
        run.update(optimizers=[dict(r) for r in spec.optimizers])
    if spec.page_faults is not None:
        run.update(page_faults=dict(spec.page_faults))
    run.set_status(spec.status)
    return run

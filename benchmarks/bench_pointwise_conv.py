"""1x1 convolutions, stock oneDNN primitives vs one GEMM each (the ops of the
``pointwise_gemm`` recipe), at ResNet-50's 1x1 shapes: forward (``aten.convolution`` vs
``profilednn::conv1x1``), input gradient (``convolution_backward`` by data vs
``profilednn::conv1x1_input_grad``) and weight gradient (by weights vs
``profilednn::conv1x1_weight_grad``).

Activations channels_last, as the recipe needs. All arms run in one process, interleaved
round by round (order rotating); medians and min-max spread; GFLOP/s = 2 N H' W' Cin Cout / t
(the same for each direction). The totals weigh each shape by how often ResNet-50 has it.
``--dtype`` defaults to bf16 on a CPU with native BF16, else fp32.

    .venv/bin/python benchmarks/bench_pointwise_conv.py
    .venv/bin/python benchmarks/bench_pointwise_conv.py --dtype fp32 --batch 8
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch

from profilednn.kernels.pointwise_conv import conv1x1, conv1x1_input_grad, conv1x1_weight_grad
from profilednn.topology import cpu_topology, dtype_speed

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# ResNet-50's 1x1 convolutions at 224 px: (in, out, input side, stride) -> how many it has
SHAPES = {(64, 64, 56, 1): 1, (64, 256, 56, 1): 4, (256, 64, 56, 1): 2, (256, 128, 56, 1): 1, (256, 512, 56, 2): 1,
          (128, 512, 28, 1): 4, (512, 128, 28, 1): 3, (512, 256, 28, 1): 1, (512, 1024, 28, 2): 1,
          (256, 1024, 14, 1): 6, (1024, 256, 14, 1): 5, (1024, 512, 14, 1): 1, (1024, 2048, 14, 2): 1,
          (512, 2048, 7, 1): 3, (2048, 512, 7, 1): 2}
DIRECTIONS = ("forward", "input_grad", "weight_grad")
CL = torch.channels_last


def _time(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def bench_shape(cin: int, cout: int, side: int, stride: int, batch: int, dtype: torch.dtype,
                rounds: int) -> dict[str, list[float]]:
    """Per-round milliseconds of each arm at one shape (after one untimed round)."""
    g = torch.Generator().manual_seed(0)
    out = (side - 1) // stride + 1
    x = torch.randn(batch, cin, side, side, generator=g).to(dtype).contiguous(memory_format=CL)
    dy = torch.randn(batch, cout, out, out, generator=g).to(dtype).contiguous(memory_format=CL)
    w = torch.randn(cout, cin, 1, 1, generator=g).to(dtype).contiguous(memory_format=CL)
    s = [stride, stride]

    def stock_backward(mask: list[bool]) -> object:
        return torch.ops.aten.convolution_backward(dy, x, w, None, s, [0, 0], [1, 1], False, [0, 0], 1, mask)

    arms = {
        ("forward", "onednn"): lambda: torch.ops.aten.convolution(x, w, None, s, [0, 0], [1, 1], False, [0, 0], 1),
        ("forward", "gemm"): lambda: conv1x1(x, w, None, stride),
        ("input_grad", "onednn"): lambda: stock_backward([True, False, False]),
        ("input_grad", "gemm"): lambda: conv1x1_input_grad(dy, x, w, stride),
        ("weight_grad", "onednn"): lambda: stock_backward([False, True, False]),
        ("weight_grad", "gemm"): lambda: conv1x1_weight_grad(dy, x, stride),
    }
    refs = {"forward": arms[("forward", "onednn")](), "input_grad": arms[("input_grad", "onednn")]()[0],
            "weight_grad": arms[("weight_grad", "onednn")]()[1]}
    for direction, ref in refs.items():
        got = arms[(direction, "gemm")]().float()
        err = float((got - ref.float()).norm() / ref.float().norm())
        if err > (2e-2 if dtype == torch.bfloat16 else 1e-4):
            raise SystemExit(f"{cin}->{cout} at {side}: the GEMM's {direction} differs from oneDNN's by {err:.2e}")
    times: dict[tuple[str, str], list[float]] = {k: [] for k in arms}
    names = list(arms)
    for r in range(rounds + 1):
        for name in names[r % len(names):] + names[:r % len(names)]:
            t = _time(arms[name])
            if r:
                times[name].append(t)
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--dtype", choices=list(DTYPES), default=None)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    topo = cpu_topology()
    dtype_name = args.dtype or ("bf16" if dtype_speed("bf16", topo.isa).faster else "fp32")
    dtype = DTYPES[dtype_name]
    print(f"{topo.model_name}, {torch.get_num_threads()} threads, {dtype_name}, batch {args.batch}, "
          f"{args.rounds} rounds; ms median (min-max), GFLOP/s of the median")
    totals = {(d, arm): 0.0 for d in DIRECTIONS for arm in ("onednn", "gemm")}
    for (cin, cout, side, stride), count in SHAPES.items():
        times = bench_shape(cin, cout, side, stride, args.batch, dtype, args.rounds)
        out = (side - 1) // stride + 1
        flops = 2.0 * args.batch * out * out * cin * cout
        med = {k: statistics.median(v) for k, v in times.items()}
        for k in totals:
            totals[k] += med[k] * count
        print(f"{cin:5d}->{cout:<5d} {side:3d}px s{stride} (x{count}):")
        for d in DIRECTIONS:
            o, g = times[(d, "onednn")], times[(d, "gemm")]
            wins = sum(b < a for a, b in zip(o, g))
            print(f"    {d:11s} onednn {med[(d, 'onednn')]:6.2f} ({min(o):.2f}-{max(o):.2f}) "
                  f"{flops / med[(d, 'onednn')] / 1e6:5.0f} GFLOP/s   gemm {med[(d, 'gemm')]:6.2f} "
                  f"({min(g):.2f}-{max(g):.2f}) {flops / med[(d, 'gemm')] / 1e6:5.0f} GFLOP/s   "
                  f"{med[(d, 'onednn')] / med[(d, 'gemm')]:.2f}x (gemm faster in {wins}/{args.rounds})")
    print("ResNet-50's 1x1 convolutions, sum of medians x count:")
    for d in DIRECTIONS:
        o, g = totals[(d, "onednn")], totals[(d, "gemm")]
        print(f"    {d:11s} onednn {o:6.1f} ms   gemm {g:6.1f} ms   {o / g:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

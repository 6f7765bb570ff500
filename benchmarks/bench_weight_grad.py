"""1x1 convolutions' weight gradients: oneDNN's backward-by-weights convolution (stock
``aten.convolution_backward``) vs one GEMM (``profilednn::conv1x1_weight_grad``, the op
the ``gemm_weight_grad`` recipe uses), at ResNet-50's 1x1 shapes, and the same shapes'
forward convolution (a GEMM of the same FLOPs) for reference.

Activations channels_last, as the recipe needs. All arms run in one process, interleaved
round by round (order rotating); medians and min-max spread; GFLOP/s = 2 N H W Cin Cout / t.
``--dtype`` defaults to bf16 on a CPU with native BF16, else fp32.

    .venv/bin/python benchmarks/bench_weight_grad.py
    .venv/bin/python benchmarks/bench_weight_grad.py --dtype fp32 --batch 8
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch

from profilednn.kernels.conv_weight_grad import conv1x1_weight_grad
from profilednn.topology import cpu_topology, dtype_speed

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# ResNet-50's 1x1 convolutions at 224 px: (in, out, input side, stride), each once
SHAPES = ((64, 64, 56, 1), (64, 256, 56, 1), (256, 64, 56, 1), (256, 128, 56, 1), (256, 512, 56, 2),
          (128, 512, 28, 1), (512, 128, 28, 1), (512, 256, 28, 1), (512, 1024, 28, 2), (256, 1024, 14, 1),
          (1024, 256, 14, 1), (1024, 512, 14, 1), (1024, 2048, 14, 2), (512, 2048, 7, 1), (2048, 512, 7, 1))
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
    arms = {
        "onednn_bwd_w": lambda: torch.ops.aten.convolution_backward(
            dy, x, w, None, s, [0, 0], [1, 1], False, [0, 0], 1, [False, True, False]),
        "gemm": lambda: conv1x1_weight_grad(dy, x, stride),
        "forward": lambda: torch.ops.aten.convolution(x, w, None, s, [0, 0], [1, 1], False, [0, 0], 1),
    }
    ref = arms["onednn_bwd_w"]()[1].float()
    err = float((arms["gemm"]().float() - ref).norm() / ref.norm())
    if err > (2e-2 if dtype == torch.bfloat16 else 1e-4):
        raise SystemExit(f"{cin}->{cout} at {side}: the GEMM's weight gradient differs from oneDNN's by {err:.2e}")
    times: dict[str, list[float]] = {k: [] for k in arms}
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
    totals = {"onednn_bwd_w": 0.0, "gemm": 0.0, "forward": 0.0}
    for cin, cout, side, stride in SHAPES:
        times = bench_shape(cin, cout, side, stride, args.batch, dtype, args.rounds)
        out = (side - 1) // stride + 1
        flops = 2.0 * args.batch * out * out * cin * cout
        med = {k: statistics.median(v) for k, v in times.items()}
        for k in totals:
            totals[k] += med[k]
        cells = "  ".join(f"{k} {med[k]:6.2f} ({min(v):.2f}-{max(v):.2f}) {flops / med[k] / 1e6:5.0f}"
                          for k, v in times.items())
        wins = sum(g < o for g, o in zip(times["gemm"], times["onednn_bwd_w"]))
        print(f"{cin:5d}->{cout:<5d} {side:3d}px s{stride}: {cells}  gemm {med['onednn_bwd_w'] / med['gemm']:.2f}x "
              f"(faster in {wins}/{args.rounds})")
    print(f"sum of medians: onednn_bwd_w {totals['onednn_bwd_w']:.1f} ms, gemm {totals['gemm']:.1f} ms "
          f"({totals['onednn_bwd_w'] / totals['gemm']:.2f}x), forward {totals['forward']:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Is a hand-written kernel worth it for the memory-bound rest of a resnet50/RetinaNet step?

Two candidates the issue names, each timed eager, as stock PyTorch's best single op, and
under ``torch.compile`` of the same code, against its bandwidth floor (compulsory bytes at
the STREAM-triad bandwidth measured in this process). A kernel can only pay where the best
of those is well above the floor.

- FrozenBatchNorm2d's ``x * scale + shift`` (torchvision's form, two passes): floor = read
  x, write y. ProfileDNN's ``frozen_batchnorm`` recipe already folds it into the preceding
  convolution (zero passes) and makes the rest one ``addcmul``.
- BatchNorm2d (training) + ReLU, forward and backward: floor = forward reads x twice
  (statistics, then normalise) and writes y; backward reads dy and the ReLU's output for the
  reductions, then again with x, and writes dx.

All arms interleaved (order rotating) in one process; medians and min-max spread.

    .venv/bin/python benchmarks/bench_memory_bound.py
    .venv/bin/python benchmarks/bench_memory_bound.py --reduced
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Callable

import torch
from torch import nn

from profilednn.hardware.machine import measure_bandwidth


def frozen_bn_eager(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    return x * scale + shift  # torchvision.ops.FrozenBatchNorm2d.forward


def frozen_bn_addcmul(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    return torch.addcmul(shift, x, scale)


def time_arms(arms: dict[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    for fn in arms.values():  # warm-up (torch.compile compiles here)
        fn()
        fn()
    names = list(arms)
    times: dict[str, list[float]] = {k: [] for k in arms}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            arms[name]()
            times[name].append((time.perf_counter() - t0) * 1e3)
    return times


def report(title: str, times: dict[str, list[float]], floor_ms: float) -> None:
    print(f"\n{title}  (floor {floor_ms:.2f} ms)")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:28} median {med:8.2f} ms  (min {min(ts):.2f}, max {max(ts):.2f})  {med / floor_ms:5.2f}x floor")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="2,256,128,128", help="N,C,H,W (default: layer1 of a 512 px batch of 2)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--reduced", action="store_true", help="2,64,64,64 and 5 rounds")
    args = ap.parse_args()
    if args.reduced:
        args.shape, args.rounds = "2,64,64,64", 5
    n, c, h, w = (int(v) for v in args.shape.split(","))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, c, h, w, generator=g)
    bw = measure_bandwidth(torch.get_num_threads()).median
    mb = x.numel() * 4 / 1e6
    print(f"shape {[n, c, h, w]} fp32 ({mb:.1f} MB per tensor), threads {torch.get_num_threads()}, "
          f"triad now {bw:.1f} GB/s, load {os.getloadavg()[0]:.2f}")

    def floor(streams: int) -> float:
        return streams * x.numel() * 4 / (bw * 1e9) * 1e3

    # FrozenBatchNorm2d: y = x * scale + shift
    scale = torch.rand(1, c, 1, 1, generator=g) + 0.5
    shift = torch.randn(1, c, 1, 1, generator=g)
    compiled = torch.compile(frozen_bn_eager)
    ref = frozen_bn_eager(x, scale, shift)
    assert torch.allclose(compiled(x, scale, shift), ref, atol=1e-6)
    times = time_arms({"eager x*scale+shift": lambda: frozen_bn_eager(x, scale, shift),
                       "one addcmul (recipe)": lambda: frozen_bn_addcmul(x, scale, shift),
                       "torch.compile": lambda: compiled(x, scale, shift)}, args.rounds)
    report("FrozenBatchNorm2d mul+add (forward)", times, floor(2))

    # BatchNorm2d (training) + ReLU, forward + backward
    def make() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.BatchNorm2d(c), nn.ReLU()).train()

    eager, comp = make(), torch.compile(make())
    dy = torch.randn(x.shape, generator=g)

    def step(mod: nn.Module) -> Callable[[], object]:
        def run() -> object:
            xi = x.detach().requires_grad_()
            mod(xi).backward(dy)
            return xi.grad
        return run

    assert torch.allclose(step(eager)(), step(comp)(), rtol=1e-4, atol=1e-5)
    times = time_arms({"eager BN+ReLU fwd+bwd": step(eager), "torch.compile fwd+bwd": step(comp)}, args.rounds)
    report("BatchNorm2d + ReLU forward + backward (training)", times, floor(3 + 5))
    print(f"\nload after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

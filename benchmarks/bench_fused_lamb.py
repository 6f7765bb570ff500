"""LAMB step time: profilednn.optim.FusedLAMB vs the per-parameter ReferenceLAMB.

The parameters of ``resnet50`` (161 tensors, 25.6 M values) and ``bert_base`` (the
MLM model: 200 tensors, 110 M values) with random gradients; the same state in both, the
steps interleaved (order alternating), medians and min-max. FusedLAMB runs its default
(the native kernel where it builds) and its multi-tensor ``foreach`` path. Also checks the
arms stay within 1e-6 of each other after the timed steps.

    .venv/bin/python benchmarks/bench_fused_lamb.py
    .venv/bin/python benchmarks/bench_fused_lamb.py --reduced   # small models, quick check
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from profilednn.optim import FusedLAMB, ReferenceLAMB
from profilednn.workloads import build_workload


def parameters(model: str, reduced: bool) -> list[torch.Tensor]:
    if model == "resnet50":
        wl = build_workload("resnet50", batch_size=2, image_size=32, num_classes=100 if reduced else 1000)
    else:
        knobs = {"layers": 2, "hidden": 256, "heads": 4} if reduced else {}
        wl = build_workload("bert_base", batch_size=1, seq_len=8, **knobs)
    seen, out = set(), []
    for p in wl.model.parameters():  # tied weights once
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out.append(p.detach())
    return out


def bench(model: str, rounds: int, reduced: bool, target: float) -> bool:
    base = parameters(model, reduced)
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(p.shape, generator=g) * 1e-2 for p in base]

    def make(cls, **kwargs):
        ps = [torch.nn.Parameter(p.clone()) for p in base]
        for p, gr in zip(ps, grads):
            p.grad = gr.clone()
        decay = [p for p in ps if p.dim() > 1]
        no_decay = [p for p in ps if p.dim() <= 1]
        return ps, cls([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                       lr=1e-3, betas=(0.9, 0.999), eps=1e-6, **kwargs)

    arms = {"per-parameter": make(ReferenceLAMB), "FusedLAMB": make(FusedLAMB),
            "foreach path": make(FusedLAMB, backend="foreach")}
    for _, opt in arms.values():
        opt.step()  # warm-up: state allocated
    times: dict[str, list[float]] = {k: [] for k in arms}
    for r in range(rounds):
        for name in (list(arms) if r % 2 == 0 else list(reversed(arms))):
            t0 = time.perf_counter()
            arms[name][1].step()
            times[name].append((time.perf_counter() - t0) * 1e3)
    diff = max(float((p - q).detach().abs().max()) for name in ("FusedLAMB", "foreach path")
               for p, q in zip(arms["per-parameter"][0], arms[name][0]))
    n = sum(p.numel() for p in base)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\n{model}: {len(base)} tensors, {n / 1e6:.1f} M values, {rounds} interleaved steps per arm")
    for name, ts in times.items():
        print(f"  {name:14} median {med[name]:9.1f} ms  (min {min(ts):.1f}, max {max(ts):.1f})")
    speedup = med["per-parameter"] / med["FusedLAMB"]
    ok = speedup >= target
    print(f"  FusedLAMB took the {arms['FusedLAMB'][1].backend_used} path; the foreach path (no C compiler) "
          f"is {med['per-parameter'] / med['foreach path']:.2f}x")
    print(f"  speedup {speedup:.2f}x (target >= {target:.1f}x: {'met' if ok else 'MISSED'}); "
          f"max |difference| after {rounds + 1} steps: {diff:.1e}")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,bert_base")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reduced", action="store_true")
    ap.add_argument("--target", type=float, default=5.0)
    args = ap.parse_args()
    if args.reduced:
        args.rounds = 3
    print(f"LAMB step, threads {torch.get_num_threads()}")
    results = [bench(m.strip(), args.rounds, args.reduced, args.target) for m in args.models.split(",")]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())

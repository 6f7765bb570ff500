"""LAMB step time: profilednn.kernels.FusedLAMB vs timm's ``Lamb`` (a real peer: its
multi-tensor ``foreach`` implementation) and against the 7-stream bandwidth bound.

The parameters of ``resnet50`` (161 tensors, 25.6 M values) and ``bert_base`` (the
MLM model: 200 tensors, 110 M values) with random gradients; the same state in every arm,
the steps interleaved (order rotating), medians and min-max. timm runs the same update as
ours (no global gradient clipping, the trust ratio on every tensor: ``max_grad_norm=None,
always_adapt=True``). FusedLAMB runs its default (the native kernel where it builds) and its
multi-tensor ``foreach`` path; ``--reference`` adds the per-parameter ReferenceLAMB. The
bound is 7 fp32 streams (read x, g, m, v; write x, m, v) at the STREAM-triad bandwidth of
``profilednn machine`` (``--bandwidth`` overrides it). Checks FusedLAMB and timm stay within
1e-4 of each other after the timed steps.

    .venv/bin/python -m pip install timm==1.0.31       # or: pip install -e .[bench]
    .venv/bin/python benchmarks/bench_fused_lamb.py
    .venv/bin/python benchmarks/bench_fused_lamb.py --reduced   # small models, quick check
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from profilednn.kernels import FusedLAMB, ReferenceLAMB
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


def bandwidth_gbs(override: float | None) -> float:
    if override:
        return override
    from profilednn.hardware.machine import cached_machine_path, get_machine, load_machine_file

    path = cached_machine_path()  # as cached, even if flagged contended (no re-measuring here)
    return (load_machine_file(path) if path.is_file() else get_machine()).bandwidth_gbs


def bench(model: str, rounds: int, reduced: bool, target: float, bound_factor: float, bw: float,
          reference: bool) -> bool:
    from timm.optim import Lamb

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

    arms = {"timm Lamb": make(Lamb, max_grad_norm=None, always_adapt=True),
            "FusedLAMB": make(FusedLAMB), "foreach path": make(FusedLAMB, backend="foreach")}
    if reference:
        arms["per-parameter"] = make(ReferenceLAMB)
    for _, opt in arms.values():
        opt.step()  # warm-up: state allocated
    times: dict[str, list[float]] = {k: [] for k in arms}
    cpu: dict[str, list[float]] = {k: [] for k in arms}  # process CPU time: less sensitive to other load
    names = list(arms)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            c0, t0 = time.process_time(), time.perf_counter()
            arms[name][1].step()
            times[name].append((time.perf_counter() - t0) * 1e3)
            cpu[name].append((time.process_time() - c0) * 1e3)
    diff = max(float((p - q).detach().abs().max()) for name in names[1:]
               for p, q in zip(arms["timm Lamb"][0], arms[name][0]))
    n = sum(p.numel() for p in base)
    bound_ms = 7 * 4 * n / (bw * 1e9) * 1e3
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\n{model}: {len(base)} tensors, {n / 1e6:.1f} M values, {rounds} interleaved steps per arm; "
          f"7-stream bound {bound_ms:.1f} ms at {bw:.1f} GB/s; load {os.getloadavg()[0]:.2f}")
    for name, ts in times.items():
        print(f"  {name:14} median {med[name]:9.1f} ms  (min {min(ts):.1f}, max {max(ts):.1f})  "
              f"{med[name] / bound_ms:5.2f}x bound  {med['timm Lamb'] / med[name]:5.2f}x timm  "
              f"cpu {statistics.median(cpu[name]):8.1f} ms")
    speedup = med["timm Lamb"] / med["FusedLAMB"]
    of_bound = med["FusedLAMB"] / bound_ms
    ok = speedup >= target and of_bound <= bound_factor and diff <= 1e-4
    print(f"  FusedLAMB took the {arms['FusedLAMB'][1].backend_used} path: {speedup:.2f}x timm "
          f"(target >= {target:.1f}x), {of_bound:.2f}x the bound (target <= {bound_factor:.2f}x); max |difference| "
          f"to timm after {rounds + 1} steps: {diff:.1e} (target <= 1e-4): {'met' if ok else 'MISSED'}")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,bert_base")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reduced", action="store_true")
    ap.add_argument("--target", type=float, default=2.5, help="required speedup over timm's Lamb")
    ap.add_argument("--bound-factor", type=float, default=1.25, help="allowed multiple of the bandwidth bound")
    ap.add_argument("--bandwidth", type=float, default=None, help="triad GB/s instead of profilednn machine's")
    ap.add_argument("--reference", action="store_true", help="also time the per-parameter ReferenceLAMB")
    args = ap.parse_args()
    if args.reduced:
        args.rounds = 3
    bw = bandwidth_gbs(args.bandwidth)
    print(f"LAMB step, threads {torch.get_num_threads()}, triad {bw:.1f} GB/s")
    results = [bench(m.strip(), args.rounds, args.reduced, args.target, args.bound_factor, bw, args.reference)
               for m in args.models.split(",")]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())

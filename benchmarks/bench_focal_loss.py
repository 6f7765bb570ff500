"""Focal loss forward + backward: profilednn.kernels.sigmoid_focal_loss vs torchvision's.

RetinaNet-like shapes by default (2 images, 120,087 anchors = 800x800 over P3-P7, 264
classes, ~0.1 % positives), reduction "sum" as RetinaNet uses it. Both run in one
process, interleaved round by round (order alternating); medians and min-max spread.

    .venv/bin/python benchmarks/bench_focal_loss.py              # full shapes, fp32
    .venv/bin/python benchmarks/bench_focal_loss.py --dtype bf16
    .venv/bin/python benchmarks/bench_focal_loss.py --reduced    # small shapes, quick check
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torchvision

from profilednn.kernels import sigmoid_focal_loss

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=2)
    ap.add_argument("--anchors", type=int, default=120_087)
    ap.add_argument("--classes", type=int, default=264)
    ap.add_argument("--dtype", choices=list(DTYPES), default="fp32")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reduced", action="store_true", help="20k anchors, 3 rounds")
    ap.add_argument("--target", type=float, default=2.0, help="required speedup of forward+backward")
    args = ap.parse_args()
    if args.reduced:
        args.anchors, args.rounds = 20_000, 3

    shape = (args.images, args.anchors, args.classes)
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(shape, generator=g) * 3 - 4).to(DTYPES[args.dtype])
    targets = torch.zeros(shape)
    positives = max(1, round(args.images * args.anchors * 0.001))
    flat = targets.view(-1, args.classes)
    flat[torch.randint(0, flat.shape[0], (positives,), generator=g),
         torch.randint(0, args.classes, (positives,), generator=g)] = 1.0
    impls = {"torchvision": torchvision.ops.sigmoid_focal_loss, "profilednn": sigmoid_focal_loss}
    print(f"focal loss {list(shape)} {args.dtype} ({logits.numel() / 1e6:.1f} M elements), reduction=sum, "
          f"threads {torch.get_num_threads()}, {args.rounds} interleaved rounds")

    def run(fn):
        x = logits.detach().clone().requires_grad_()
        t0 = time.perf_counter()
        loss = fn(x, targets, alpha=0.25, gamma=2.0, reduction="sum")
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        return (t1 - t0) * 1e3, (t2 - t1) * 1e3, loss.detach(), x.grad

    # warm-up, and the numerics check
    (_, _, l_ref, g_ref), (_, _, l_new, g_new) = run(impls["torchvision"]), run(impls["profilednn"])
    loss_rel = abs(float(l_new) - float(l_ref)) / abs(float(l_ref))
    grad_rel = float((g_new.float() - g_ref.float()).norm() / g_ref.float().norm())
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in impls}
    for r in range(args.rounds):
        order = list(impls) if r % 2 == 0 else list(reversed(impls))
        for name in order:
            fwd, bwd, _, _ = run(impls[name])
            times[name].append((fwd, bwd))
    print(f"\n{'impl':12} {'forward ms':>11} {'backward ms':>12} {'total ms':>10} {'total min-max':>17}")
    med = {}
    for name, ts in times.items():
        totals = [f + b for f, b in ts]
        med[name] = statistics.median(totals)
        print(f"{name:12} {statistics.median(f for f, _ in ts):11.1f} {statistics.median(b for _, b in ts):12.1f} "
              f"{med[name]:10.1f} {min(totals):8.1f}-{max(totals):.1f}")
    speedup = med["torchvision"] / med["profilednn"]
    ok = speedup >= args.target
    print(f"\nspeedup (forward+backward): {speedup:.2f}x (target >= {args.target:.1f}x: {'met' if ok else 'MISSED'})")
    print(f"numerics vs torchvision: loss rel diff {loss_rel:.1e}, gradient rel L2 diff {grad_rel:.1e}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Focal loss forward + backward: profilednn.kernels.sigmoid_focal_loss vs torch.compile of
torchvision's, and against the memory-bandwidth floor.

RetinaNet-like shapes by default (2 images, 120,087 anchors = 800x800 over P3-P7, 264
classes, ~0.1 % positives), reduction "sum" as RetinaNet uses it. All arms run in one
process, interleaved round by round (order rotating); medians and min-max spread.

Arms: ``torch.compile`` (inductor's fusion of ``torchvision.ops.sigmoid_focal_loss``),
``native`` (the C kernel: one pass writes the loss sums and the gradient); with
``--fallback`` the portable PyTorch-ops path, with ``--eager`` torchvision itself (both slow).
The floor is the compulsory traffic (read logits and targets, write the gradient) at the
STREAM-triad bandwidth of ``profilednn machine`` (``--bandwidth`` overrides it).
Each round drops the previous round's gradient, as a training step does: the native arm
then recycles its gradient buffer, the others get theirs afresh from the allocator (for
254 MB that is new pages from the OS, ~62,000 page faults, which is what stock PyTorch
pays every step). "cpu ms" (process CPU time) is the figure to trust on a shared machine.

    .venv/bin/python benchmarks/bench_focal_loss.py              # full shapes, fp32
    .venv/bin/python benchmarks/bench_focal_loss.py --dtype bf16
    .venv/bin/python benchmarks/bench_focal_loss.py --reduced    # small shapes, quick check
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from functools import partial

import torch
import torchvision

from profilednn.kernels import sigmoid_focal_loss
from profilednn.hardware.machine import measure_bandwidth

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def bandwidth_gbs(override: float | None) -> tuple[float, str]:
    """The triad bandwidth (GB/s) and where it came from."""
    if override:
        return override, "--bandwidth"
    from profilednn.hardware.machine import cached_machine_path, get_machine, load_machine_file

    path = cached_machine_path()  # as cached, even if flagged contended (no re-measuring here)
    prof = load_machine_file(path) if path.is_file() else get_machine()
    note = ", measured under load" if prof.contended else ""
    return prof.bandwidth_gbs, f"profilednn machine, measured {prof.measured}{note}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=2)
    ap.add_argument("--anchors", type=int, default=120_087)
    ap.add_argument("--classes", type=int, default=264)
    ap.add_argument("--dtype", choices=list(DTYPES), default="fp32")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--eager", action="store_true", help="also time torchvision eager (slow)")
    ap.add_argument("--fallback", action="store_true", help="also time the PyTorch-ops fallback (slow)")
    ap.add_argument("--reduced", action="store_true", help="20k anchors, 3 rounds")
    ap.add_argument("--bandwidth", type=float, default=None, help="triad GB/s instead of profilednn machine's")
    ap.add_argument("--target", type=float, default=1.5, help="required speedup over torch.compile")
    ap.add_argument("--floor-factor", type=float, default=4.0, help="allowed multiple of the bandwidth floor")
    args = ap.parse_args()
    if args.reduced:
        args.anchors, args.rounds = 20_000, 3

    shape = (args.images, args.anchors, args.classes)
    dtype = DTYPES[args.dtype]
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(shape, generator=g) * 3 - 4).to(dtype)
    targets = torch.zeros(shape, dtype=dtype)
    positives = max(1, round(args.images * args.anchors * 0.001))
    flat = targets.view(-1, args.classes)
    flat[torch.randint(0, flat.shape[0], (positives,), generator=g),
         torch.randint(0, args.classes, (positives,), generator=g)] = 1.0
    compiled = torch.compile(torchvision.ops.sigmoid_focal_loss)
    impls = {"torch.compile": compiled, "native": partial(sigmoid_focal_loss, backend="native")}
    if args.fallback:
        impls["torch-ops"] = partial(sigmoid_focal_loss, backend="torch")
    if args.eager:
        impls["eager"] = torchvision.ops.sigmoid_focal_loss
    bw, bw_from = bandwidth_gbs(args.bandwidth)
    n = logits.numel()
    floor_bytes = n * (2 * logits.element_size() + targets.element_size())  # read x, y; write grad
    floor_ms = floor_bytes / (bw * 1e9) * 1e3
    print(f"focal loss {list(shape)} {args.dtype} ({n / 1e6:.1f} M elements), reduction=sum, "
          f"threads {torch.get_num_threads()}, {args.rounds} interleaved rounds; load {os.getloadavg()[0]:.2f}")
    print(f"bandwidth floor: {floor_bytes / 1e9:.3f} GB at {bw:.1f} GB/s triad ({bw_from}) = {floor_ms:.1f} ms")
    triad_now = measure_bandwidth(torch.get_num_threads()).median
    print(f"(triad measured now, under the current load: {triad_now:.1f} GB/s -> floor "
          f"{floor_bytes / (triad_now * 1e9) * 1e3:.1f} ms)")

    def run(fn):
        x = logits.detach().clone().requires_grad_()
        c0, t0 = time.process_time(), time.perf_counter()
        loss = fn(x, targets, alpha=0.25, gamma=2.0, reduction="sum")
        t1 = time.perf_counter()
        loss.backward()
        t2, c2 = time.perf_counter(), time.process_time()
        return (t1 - t0) * 1e3, (t2 - t1) * 1e3, (c2 - c0) * 1e3, loss.detach(), x.grad

    # warm-up (torch.compile compiles here), and the numerics check against the compiled reference
    results = {name: run(fn) for name, fn in impls.items()}
    _, _, _, l_ref, g_ref = results["torch.compile"]
    numerics = {}
    for name in impls:
        _, _, _, loss, grad = results[name]
        numerics[name] = (abs(float(loss) - float(l_ref)) / abs(float(l_ref)),
                          float((grad.float() - g_ref.float()).norm() / g_ref.float().norm()))
    del results, l_ref, g_ref
    names = list(impls)
    times: dict[str, list[tuple[float, float, float]]] = {k: [] for k in impls}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            fwd, bwd, cpu, _, _ = run(impls[name])
            times[name].append((fwd, bwd, cpu))
    # "cpu ms": CPU time of the whole process over forward+backward (all threads): less
    # sensitive than wall time to other processes taking the cores.
    print(f"\n{'impl':14} {'forward ms':>11} {'backward ms':>12} {'total ms':>10} {'min-max':>15} "
          f"{'cpu ms':>8} {'x floor':>8} {'loss rel':>9} {'grad rel':>9}")
    med, cpu = {}, {}
    for name, ts in times.items():
        totals = [f + b for f, b, _ in ts]
        med[name] = statistics.median(totals)
        cpu[name] = statistics.median(c for _, _, c in ts)
        print(f"{name:14} {statistics.median(f for f, _, _ in ts):11.1f} {statistics.median(b for _, b, _ in ts):12.1f} "
              f"{med[name]:10.1f} {min(totals):7.1f}-{max(totals):<7.1f} {cpu[name]:8.1f} {med[name] / floor_ms:8.1f} "
              f"{numerics[name][0]:9.1e} {numerics[name][1]:9.1e}")
    speedup = med["torch.compile"] / med["native"]
    of_floor = med["native"] / floor_ms
    ok = speedup >= args.target and of_floor <= args.floor_factor
    print(f"\nnative vs torch.compile (forward+backward): {speedup:.2f}x wall, {cpu['torch.compile'] / cpu['native']:.2f}x "
          f"CPU time (target >= {args.target:.1f}x); {of_floor:.2f}x the bandwidth floor (target <= "
          f"{args.floor_factor:.0f}x): {'met' if ok else 'MISSED'}")
    print(f"load after: {os.getloadavg()[0]:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

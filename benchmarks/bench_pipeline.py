"""Pipeline: accuracy of the asynchronous schedule on the digits, schedule step times on
the CPU, and (with CUDA) the largest ResNet-50 batch the hybrid GPU+CPU pipeline trains
compared with the GPU alone.

CPU part (always): digits MLP, plain training vs gpipe / 1f1b / async (weight stashing),
async without stashing, async with weight averaging: test accuracy; small_cnn on cpu,cpu:
median step time of gpipe, 1f1b and async in one process and of gpipe/1f1b over two
processes (torch.distributed.pipelining).
GPU part (when CUDA is available, else "skipped: no CUDA"): the largest batch of
ResNet-50 training that fits on cuda:0 alone (doubling, then bisection, on out-of-memory),
then the pipeline over cuda:0,cpu (1F1B, micro-batches) at twice that batch: it must train.

    .venv/bin/python benchmarks/bench_pipeline.py
    .venv/bin/python benchmarks/bench_pipeline.py --quick
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys

import polars as pl
import torch

from profilednn.memory.pipeline import PipelineTrainer, as_layer_sequence, balance_layers, split_layers
from profilednn.memory.pipeline.balancer import measure_layer_times
from profilednn.memory.pipeline.runner import train_pipeline
from profilednn.workloads import build_workload

CPU = torch.device("cpu")


def show(df: pl.DataFrame) -> None:
    with pl.Config(tbl_rows=50, tbl_cols=20, tbl_width_chars=200, float_precision=3, tbl_hide_dataframe_shape=True):
        print(df)


def digits_accuracy(epochs: int, microbatches: int) -> pl.DataFrame:
    rows = []
    for label, kw in [("gpipe", {"schedule": "gpipe"}), ("1f1b", {"schedule": "1f1b"}),
                      ("async (stashing)", {"schedule": "async"}),
                      ("async, no stashing", {"schedule": "async", "stash": False}),
                      ("async + averaging", {"schedule": "async", "average": True})]:
        r = train_pipeline("digits_mlp", [CPU, CPU], microbatches=microbatches, epochs=epochs, balance=[3, 2], **kw)
        s = r.summary
        rows.append({"schedule": label, "accuracy": s["accuracy"], "plain_accuracy": s["reference_accuracy"],
                     "gap_points": 100 * (s["accuracy"] - s["reference_accuracy"]),
                     "averaged_accuracy": s.get("averaged_accuracy")})
    return pl.DataFrame(rows)


def schedule_times(batch: int, image: int, steps: int, microbatches: int) -> pl.DataFrame:
    rows = []
    balance = None  # the balancer's cut from the first run, kept for every schedule
    for schedule, processes in [("gpipe", False), ("1f1b", False), ("async", False), ("gpipe", True), ("1f1b", True)]:
        r = train_pipeline("small_cnn", [CPU, CPU], schedule=schedule, microbatches=microbatches, steps=steps,
                           batch_size=batch, knobs={"image_size": image}, processes=processes, balance=balance)
        balance = r.summary["balance"]
        wall = r.steps["wall_ms"].to_list()[1:] or r.steps["wall_ms"].to_list()  # first step warms up
        rows.append({"schedule": schedule, "engine": "processes" if processes else "one process",
                     "balance": str(r.summary["balance"]), "median_ms": statistics.median(wall),
                     "min_ms": min(wall), "max_ms": max(wall)})
    return pl.DataFrame(rows)


def _gpu_step_fits(batch: int, image: int) -> bool:
    wl = build_workload("resnet50", batch_size=batch, image_size=image)
    wl.model.to("cuda:0")
    x, y = wl.batches[0]
    try:
        for _ in range(2):
            wl.optimizer.zero_grad(set_to_none=True)
            wl.loss_fn(wl.model(x.to("cuda:0")), y.to("cuda:0")).backward()
            wl.optimizer.step()
        torch.cuda.synchronize()
        return True
    except torch.OutOfMemoryError:
        return False
    finally:
        del wl
        gc.collect()
        torch.cuda.empty_cache()


def gpu_max_batch(image: int, start: int) -> int:
    lo, hi = 0, start
    while _gpu_step_fits(hi, image):
        lo, hi = hi, hi * 2
    while hi - lo > max(1, lo // 16):
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _gpu_step_fits(mid, image) else (lo, mid)
    return lo


def hybrid_trains(batch: int, image: int, microbatches: int, gpu_speedup: float) -> tuple[bool, str]:
    wl = build_workload("resnet50", batch_size=batch, image_size=image)
    seq = as_layer_sequence(wl.model)
    x, y = wl.batches[0]
    micro = x[: max(1, batch // microbatches)]
    times = measure_layer_times(seq.model, micro[:2], repeats=1)
    cut = balance_layers(times, 2, speeds=[gpu_speedup, 1.0])
    devices = [torch.device("cuda:0"), CPU]
    stages = split_layers(seq.model, cut.counts)
    opt_type, defaults = type(wl.optimizer), dict(wl.optimizer.defaults)
    trainer = PipelineTrainer(stages, devices, wl.loss_fn, lambda m: opt_type(m.parameters(), **defaults),
                              schedule="1f1b", threads=True)
    try:
        for _ in range(2):
            trainer.run(list(zip(x.chunk(microbatches), y.chunk(microbatches))))
        torch.cuda.synchronize()
        return True, f"balance {cut.counts}, GPU peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB"
    except torch.OutOfMemoryError as exc:
        return False, f"balance {cut.counts}: out of memory ({exc})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer epochs and steps (checks the benchmark runs)")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=32, help="small_cnn mini-batch for step times")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--gpu-image-size", type=int, default=224)
    ap.add_argument("--gpu-start-batch", type=int, default=64)
    ap.add_argument("--gpu-microbatches", type=int, default=8)
    ap.add_argument("--gpu-speedup", type=float, default=20.0, help="GPU stage speed relative to the CPU stage")
    ap.add_argument("--strict", action="store_true", help="exit 1 when the GPU check fails")
    args = ap.parse_args()
    if args.quick:
        args.epochs, args.steps, args.batch_size, args.image_size = 3, 3, 16, 32
    print(f"threads {torch.get_num_threads()}")
    print(f"\n== Digits: test accuracy, {args.epochs} epochs, {args.microbatches} micro-batches of 16 ==")
    show(digits_accuracy(args.epochs, args.microbatches))
    print(f"\n== small_cnn on cpu,cpu: step time (batch {args.batch_size}, image {args.image_size}) ==")
    show(schedule_times(args.batch_size, args.image_size, args.steps, args.microbatches))

    print("\n== GPU check: hybrid cuda:0,cpu pipeline vs the GPU alone (ResNet-50) ==")
    if not torch.cuda.is_available():
        print("skipped: no CUDA")
        return 0
    alone = gpu_max_batch(args.gpu_image_size, args.gpu_start_batch)
    ok, detail = hybrid_trains(2 * alone, args.gpu_image_size, args.gpu_microbatches, args.gpu_speedup)
    print(f"GPU alone: largest batch {alone} at {args.gpu_image_size}; hybrid pipeline at batch {2 * alone}: "
          f"{'trains' if ok else 'FAILS'} ({detail})")
    return 0 if ok or not args.strict else 1


if __name__ == "__main__":
    sys.exit(main())

"""Memory: footprint prediction accuracy, the none/offload/checkpoint/both table, and (with
CUDA) the offloading check on ResNet-50.

CPU part (always): predicted vs measured saved activations and peak for small_cnn and
the model given; the trade-off table on the CPU (where offloading cannot lower the peak:
host and device are one memory; the table shows its copy cost).
GPU part (when CUDA is available, else "skipped: no CUDA"): ResNet-50 training on
cuda:0, none vs offload: the peak (``max_memory_allocated``) must drop by >= 50% at
<= 25% step slowdown. Every configuration runs in this one process; times are medians.

    .venv/bin/python benchmarks/bench_memory.py            # resnet50 batch 8 at 112 on the CPU
    .venv/bin/python benchmarks/bench_memory.py --quick    # small shapes, a minute
    .venv/bin/python benchmarks/bench_memory.py --gpu-batch-size 128 --strict
"""

from __future__ import annotations

import argparse
import sys

import polars as pl
import torch

from profilednn.memory.footprint import measure_footprint
from profilednn.memory.tradeoff import memory_tradeoff
from profilednn.memory.training import build_on_device
from profilednn.memory.units import format_bytes


def footprint_rows(models: list[tuple[str, dict]]) -> pl.DataFrame:
    rows = []
    for name, knobs in models:
        s = measure_footprint(build_on_device(name, **knobs)).summary
        rows.append({
            "model": name, "batch": s["batch_size"], "image": knobs.get("image_size"),
            "saved_pred_MiB": s["saved_predicted_bytes"] / 2**20, "saved_meas_MiB": s["saved_measured_bytes"] / 2**20,
            "saved_err_pct": 100 * s["saved_error"], "peak_pred_MiB": s["predicted_peak_bytes"] / 2**20,
            "peak_meas_MiB": s["measured_peak_bytes"] / 2**20, "peak_err_pct": 100 * s["peak_error"],
        })
    return pl.DataFrame(rows)


def show(df: pl.DataFrame) -> None:
    with pl.Config(tbl_rows=50, tbl_cols=20, tbl_width_chars=200, float_precision=2, tbl_hide_dataframe_shape=True):
        print(df)


def tradeoff_view(df: pl.DataFrame) -> pl.DataFrame:
    return df.select(
        "config", "checkpoint_policy", "device", "batch_size",
        (pl.col("saved_device_bytes") / 2**20).alias("saved_on_device_MiB"),
        (pl.col("offloaded_bytes") / 2**20).alias("offloaded_MiB"),
        (pl.col("peak_bytes") / 2**20).alias("peak_MiB"), "peak_vs_none",
        "step_ms", "step_ms_min", "step_ms_max", "slowdown_vs_none",
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small shapes (checks the benchmark runs)")
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--image-size", type=int, default=112)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per configuration")
    ap.add_argument("--checkpoint", default="every:2", help="checkpoint policy for the table")
    ap.add_argument("--offload-min-bytes", type=int, default=256 * 1024)
    ap.add_argument("--offload-fraction", type=float, default=1.0,
                    help="GPU: offload at most this fraction of the saved activations (earliest first)")
    ap.add_argument("--gpu-batch-size", type=int, default=64)
    ap.add_argument("--gpu-image-size", type=int, default=224)
    ap.add_argument("--strict", action="store_true", help="exit 1 when the GPU check misses its targets")
    args = ap.parse_args()
    if args.quick:
        args.model, args.batch_size, args.image_size, args.steps = "small_cnn", 16, 32, 2
        args.gpu_batch_size, args.gpu_image_size = 16, 64
    knobs = {"batch_size": args.batch_size, "image_size": args.image_size}
    print(f"threads {torch.get_num_threads()}; CPU part: {args.model} batch {args.batch_size} image {args.image_size}")

    print("\n== Footprint: predicted vs measured (CPU) ==")
    models = [("small_cnn", {"batch_size": 8, "image_size": 32})]
    if args.model != "small_cnn":
        models.append((args.model, knobs))
    show(footprint_rows(models))

    print(f"\n== Memory vs step time (CPU, {args.model}) ==")
    df = memory_tradeoff(args.model, checkpoint_policy=args.checkpoint, offload_min_bytes=args.offload_min_bytes,
                         steps=args.steps, **knobs)
    show(tradeoff_view(df))
    print("note: on a CPU the host is the device, so offloading copies without lowering the peak.")

    print("\n== GPU check: offloading ResNet-50 activations ==")
    if not torch.cuda.is_available():
        print("skipped: no CUDA")
        return 0
    gpu_model = "small_cnn" if args.quick else "resnet50"
    gpu_knobs = {"batch_size": args.gpu_batch_size, "image_size": args.gpu_image_size}
    cap = None
    if args.offload_fraction < 1.0:
        saved = measure_footprint(build_on_device(gpu_model, device="cuda:0", **gpu_knobs)).summary
        cap = int(saved["saved_measured_bytes"] * args.offload_fraction)
    gpu = memory_tradeoff(gpu_model, device="cuda:0", configs=("none", "offload"), steps=max(3, args.steps),
                          offload_min_bytes=args.offload_min_bytes, offload_max_bytes=cap, **gpu_knobs)
    show(tradeoff_view(gpu))
    row = {r["config"]: r for r in gpu.iter_rows(named=True)}["offload"]
    cut = 1 - row["peak_vs_none"]
    slow = row["slowdown_vs_none"] - 1
    ok = cut >= 0.5 and slow <= 0.25
    print(f"{gpu_model} batch {args.gpu_batch_size}@{args.gpu_image_size}: peak cut {cut * 100:.1f}% "
          f"(target >= 50%), slowdown {slow * 100:+.1f}% (target <= 25%): {'PASS' if ok else 'MISS'}; "
          f"peak {format_bytes(row['peak_bytes'])}")
    return 0 if ok or not args.strict else 1


if __name__ == "__main__":
    sys.exit(main())

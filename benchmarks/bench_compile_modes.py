"""torch.compile modes on a BF16 training step: eager vs ``default`` vs ``max-autotune``.

Issue 30 asked for Inductor's AMX micro-GEMM and ``max-autotune`` "where they pay". This
measures whether they can pay in *training*: a built-in workload (default: bert_base, batch
8, sequence 128; its step is mostly Linear GEMMs, where a GEMM template would matter most)
in BF16 autocast, its model compiled in each mode. For each mode: the compile time (the
first step, with Inductor's FX graph cache off so every mode compiles from scratch), the
step's median and min-max over the timed steps, and how the compiled graphs compute their
GEMMs: Inductor's C++ micro-GEMM template (``micro_gemm`` in the generated code) or ATen's
``extern_kernels.mm/addmm/bmm``. Each mode runs in its own child processes, interleaved
(A B C, C B A, ...). Run it alone on an idle machine:

    .venv/bin/python benchmarks/bench_compile_modes.py                     # bert_base, 2 rounds
    .venv/bin/python benchmarks/bench_compile_modes.py --model resnet50 --batch-size 16
    .venv/bin/python benchmarks/bench_compile_modes.py --tiny              # a quick check that it runs
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time

import torch
import torch._inductor.config as inductor_config
from torch._inductor.utils import run_and_get_code

from profilednn.topology import detected_topology
from profilednn.train_step import TrainStep
from profilednn.workloads import build_workload

MODES = ("eager", "default", "max-autotune-no-cudagraphs")


def build(args: argparse.Namespace, mode: str) -> tuple[TrainStep, float, dict[str, int]]:
    """The workload in BF16 with its model compiled in ``mode``; compile seconds (the first
    step) and the GEMM kernels its generated code calls."""
    knobs = {"batch_size": args.batch_size, "seq_len": args.seq_len, "image_size": args.image_size}
    setup = build_workload(args.model, dtype="bf16", seed=0, **{k: v for k, v in knobs.items() if v})
    kernels: dict[str, int] = {}
    if mode != "eager":
        setup.model = torch.compile(setup.model, mode=None if mode == "default" else mode)
        setup.compiled = True
    start = time.perf_counter()
    if mode == "eager":
        setup.run()
    else:
        _, codes = run_and_get_code(setup.run)
        code = "\n".join(codes)
        kernels = {"micro_gemm": code.count("micro_gemm"),
                   **{k: len(re.findall(rf"extern_kernels\.{k}\(", code)) for k in ("mm", "addmm", "bmm")}}
    return setup, time.perf_counter() - start, kernels


def one_mode(args: argparse.Namespace) -> None:
    """A child process: build, compile and time one mode; one JSON line on stdout."""
    inductor_config.fx_graph_cache = False  # every mode compiles from scratch: its compile time is its own
    setup, seconds, kernels = build(args, args.one)
    setup.run()  # a second call: any recompilation stays out of the timing
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        setup.run()
        times.append((time.perf_counter() - t0) * 1000.0)
    print(json.dumps({"compile_s": seconds, "kernels": kernels, "times_ms": times}), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="bert_base")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--image-size", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=2, help="child processes per mode (interleaved)")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per child process")
    parser.add_argument("--tiny", action="store_true", help="small_cnn, 1 round of 1 step: a check that it runs")
    parser.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)  # a child process: one mode
    args = parser.parse_args()
    if args.tiny:
        args.model, args.batch_size, args.rounds, args.steps = "small_cnn", 4, 1, 1
    if args.one:
        one_mode(args)
        return 0
    topo = detected_topology()
    print(f"CPU: {topo.model_name}, {torch.get_num_threads()} threads; {args.model} b{args.batch_size} in BF16 "
          f"autocast; {args.rounds} child processes per mode x {args.steps} timed steps, interleaved")
    passed = [f"--{k}={v}" for k, v in (("model", args.model), ("batch-size", args.batch_size),
                                         ("seq-len", args.seq_len), ("image-size", args.image_size),
                                         ("steps", args.steps)) if v is not None]
    out: dict[str, list[dict]] = {m: [] for m in MODES}
    for r in range(args.rounds):
        for mode in (MODES if r % 2 == 0 else MODES[::-1]):
            done = subprocess.run([sys.executable, __file__, "--one", mode, *passed], capture_output=True, text=True,
                                  check=False)
            if done.returncode != 0:
                print(f"  {mode}: child failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
                return 1
            out[mode].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"  round {r + 1} {mode}: compile {out[mode][-1]['compile_s']:.1f} s", flush=True)
    eager = statistics.median(t for o in out["eager"] for t in o["times_ms"])
    for mode in MODES:
        times = [t for o in out[mode] for t in o["times_ms"]]
        med = statistics.median(times)
        kernels = out[mode][0]["kernels"]
        gemms = ", ".join(f"{k} {v}" for k, v in kernels.items()) if kernels else "ATen eager"
        compile_s = statistics.median(o["compile_s"] for o in out[mode])
        print(f"  {mode:28} step {med:8.1f} ms ({min(times):.1f}-{max(times):.1f}), {eager / med:.3f}x eager; "
              f"first step {compile_s:.1f} s; GEMMs in the generated code: {gemms}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

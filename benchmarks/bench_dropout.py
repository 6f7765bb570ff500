"""Dropout forward + backward: profilednn.kernels.FusedDropout vs stock nn.Dropout (eager) vs
torch.compile of the stock module, at bert_base's shapes.

Shapes (batch 8, sequence 128): the hidden states [8, 128, 768] (after the embeddings,
attention output and FFN output), the FFN's inner activation [8, 128, 3072] and the
attention probabilities [8, 12, 128, 128]; p = 0.1 as in BERT. All arms run in one process,
interleaved round by round (order alternating), each round a fresh forward and a backward
of a given gradient; medians and min-max spread, plus process CPU time per call (the figure
to trust on a shared machine). The masks differ between arms by design (another generator).

    .venv/bin/python benchmarks/bench_dropout.py                  # fp32 and bf16, 15 rounds
    .venv/bin/python benchmarks/bench_dropout.py --dtype bf16 --rounds 31
    .venv/bin/python benchmarks/bench_dropout.py --rounds 1       # quick check that it runs
    .venv/bin/python benchmarks/bench_dropout.py --attention      # SDPA with dropout_p, see below

``--attention`` times ``F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)``
forward + backward against ``profilednn.kernels.scaled_dot_product_attention`` (the same math
path, in fp32 as torch's, with the fused dropout on the probabilities) and ``torch.compile`` of
torch's call, at nanoGPT's ([16, 4, 128, 64]) and bert_base's ([8, 12, 128, 64]) attention.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from profilednn.kernels.attention import scaled_dot_product_attention
from profilednn.kernels.dropout import FusedDropout, native_available

BERT_SHAPES = ((8, 128, 768), (8, 128, 3072), (8, 12, 128, 128))
ATTENTION_SHAPES = ((16, 4, 128, 64), (8, 12, 128, 64))  # nanoGPT (n_embd 256), bert_base: [batch, heads, L, E]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def compare_arms(shape: tuple[int, ...], arms: dict[str, Callable[..., Any]], run: Callable[[Any], None],
                 rounds: int, ours: str) -> dict[str, float]:
    """Warm each arm (compile included), time ``run(arm)`` over interleaved rounds (order
    alternating), print the row (median, min-max, median process CPU time; ``ours`` against
    every other arm) and return the medians in ms."""
    for fn in arms.values():
        for _ in range(2):
            run(fn)  # compile and warm
    wall: dict[str, list[float]] = {k: [] for k in arms}
    cpu: dict[str, list[float]] = {k: [] for k in arms}
    for r in range(rounds):
        for name in arms if r % 2 == 0 else reversed(list(arms)):
            t, c = time.perf_counter(), time.process_time()
            run(arms[name])
            wall[name].append((time.perf_counter() - t) * 1e3)
            cpu[name].append((time.process_time() - c) * 1e3)
    med = {k: statistics.median(v) for k, v in wall.items()}
    cells = "  ".join(f"{k} {med[k]:7.2f} ms ({min(wall[k]):.2f}-{max(wall[k]):.2f}; cpu "
                      f"{statistics.median(cpu[k]):.2f})" for k in arms)
    ratios = ", ".join(f"vs {k} {med[k] / med[ours]:.2f}x" for k in arms if k != ours)
    print(f"  {str(list(shape)):20} {cells}  {ours}: {ratios}", flush=True)
    return med


def bench_shape(shape: tuple[int, ...], dtype: torch.dtype, p: float, rounds: int) -> dict[str, float]:
    """Median ms per forward + backward of each arm at ``shape``; prints the row."""
    arms: dict[str, nn.Module] = {
        "stock eager": nn.Dropout(p),
        "torch.compile(stock)": torch.compile(nn.Dropout(p)),
        "fused kernel": FusedDropout(p),
    }
    x = torch.randn(shape).to(dtype)
    g = torch.randn(shape).to(dtype)

    def run(fn: nn.Module) -> None:
        fn(x.detach().requires_grad_()).backward(g)

    return compare_arms(shape, arms, run, rounds, "fused kernel")


def bench_attention(shape: tuple[int, ...], dtype: torch.dtype, p: float, rounds: int) -> dict[str, float]:
    """Median ms per SDPA forward + backward (causal, dropout ``p``) of each arm; prints the row."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(shape).to(dtype) for _ in range(3))
    g = torch.randn(shape).to(dtype)

    def stock(q, k, v):  # noqa: ANN001, ANN202
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)

    arms = {"torch SDPA": stock, "torch.compile(SDPA)": torch.compile(stock),
            "fused": lambda q, k, v: scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)}

    def run(fn: Callable[..., torch.Tensor]) -> None:
        fn(*(t.detach().requires_grad_() for t in (q, k, v))).backward(g)

    return compare_arms(shape, arms, run, rounds, "fused")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=[*DTYPES, "both"], default="both")
    ap.add_argument("--rounds", type=int, default=15, help="interleaved rounds per shape")
    ap.add_argument("-p", type=float, default=0.1, help="dropout probability (BERT: 0.1)")
    ap.add_argument("--attention", action="store_true",
                    help="SDPA with dropout_p: torch's vs the fused kernel's vs torch.compile of torch's")
    args = ap.parse_args()
    if not native_available():
        print("the fused dropout kernel cannot be built here (no C compiler): nothing to compare")
        return 1
    dtypes = list(DTYPES) if args.dtype == "both" else [args.dtype]
    ok = True
    if args.attention:
        for name in dtypes:
            print(f"\n== scaled_dot_product_attention, causal, dropout_p={args.p}, forward + backward, {name}, "
                  f"threads {torch.get_num_threads()}: fused dropout vs torch vs torch.compile(torch)", flush=True)
            for shape in ATTENTION_SHAPES:
                med = bench_attention(shape, DTYPES[name], args.p, args.rounds)
                ok &= med["fused"] < med["torch SDPA"]
        return 0 if ok else 1
    for name in dtypes:
        print(f"\n== dropout p={args.p} forward + backward, {name}, threads {torch.get_num_threads()}: "
              "fused kernel vs stock eager vs torch.compile(stock)", flush=True)
        for shape in BERT_SHAPES:
            med = bench_shape(shape, DTYPES[name], args.p, args.rounds)
            ok &= med["fused kernel"] < med["stock eager"]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

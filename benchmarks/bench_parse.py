"""Benchmark: parse + decode + breakdown of a realistic 1,000,000-line verbose log.

Writes a log mixing drivers (conv fwd/bwd, reorder, batch norm, eltwise, pooling, inner
product, matmul, softmax, binary, sum, concat, layer norm) and dialects (oneDNN 3.6+
with timestamps, 3.3, 2.5, DNNL 1.x, MKL-DNN 0.x) with interleaved program output and
ProfileDNN marker lines, then times two paths over several repeats, each run in a fresh
subprocess (so peak RSS is per run):

* ``read_log`` (parse + decode into the full primitive table) + ``breakdown``;
* ``scan_log`` + ``breakdown`` -- the lean path ``profilednn breakdown`` takes.

Target on the project's 2-core machine: median <= 2 s and peak RSS <= 1 GB for both.
``--strict`` exits non-zero when a target is missed.

    .venv/bin/python benchmarks/bench_parse.py [--lines 1000000] [--repeats 5] [--strict]
    .venv/bin/python benchmarks/bench_parse.py --gigabyte   # also a ~1 GB log, lean path
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 2.0
TARGET_RSS_MB = 1024.0

# (dialect, prefix template, md style) -- prefix gets the event; {ts} is a timestamp.
_HEADERS = [
    ("onednn_v3.6", "onednn_verbose,v1,{ts},primitive,{event},cpu,", "v1", 0.45),
    ("onednn_v3.3", "onednn_verbose,{ts},primitive,{event},cpu,", "v3", 0.20),
    ("onednn_v2.5", "onednn_verbose,{event},cpu,", "v2", 0.15),
    ("dnnl_v1", "dnnl_verbose,{event},cpu,", "v2", 0.12),
    ("mkldnn_v0", "mkldnn_verbose,{event},", "v0", 0.08),
]


def _md(style: str, arg: str, dt: str, tag: str) -> str:
    if style == "v1":
        return f"{arg}:{dt}::blocked:{tag}::f0"
    if style == "v3":
        return f"{arg}_{dt}::blocked:{tag}::f0"
    if style == "v2":
        return f"{arg}_{dt}::blocked:{tag}:f0"
    return f"f{arg}:{tag}"


def _bodies(style: str) -> list[tuple[str, float]]:
    """(body after the engine field, weight) for one dialect's memory-descriptor style."""
    def mds(*items: tuple[str, str, str]) -> str:
        return " ".join(_md(style, a, d, t) for a, d, t in items)

    attrs = "" if style == "v0" else ("attr-scratchpad:user" if style in ("v1", "v3") else "scratchpad_mode:user;")
    sep = "," if style == "v0" else f",{attrs},"
    out: list[tuple[str, float]] = []
    convs = [
        "mb32_ic3oc64_ih224oh112kh7sh2dh0ph3_iw224ow112kw7sw2dw0pw3",
        "mb32_ic64oc64_ih56oh56kh1sh1dh0ph0_iw56ow56kw1sw1dw0pw0",
        "mb32_ic64oc64_ih56oh56kh3sh1dh0ph1_iw56ow56kw3sw1dw0pw1",
        "mb32_ic128oc128_ih28oh28kh3sh1dh0ph1_iw28ow28kw3sw1dw0pw1",
        "mb32_ic256oc256_ih14oh14kh3sh1dh0ph1_iw14ow14kw3sw1dw0pw1",
        "mb32_ic512oc512_ih7oh7kh3sh1dh0ph1_iw7ow7kw3sw1dw0pw1",
        "g32mb32_ic256oc256_ih28oh14kh3sh2dh0ph1_iw28ow14kw3sw2dw0pw1",
        "mb32_ic64oc128_id8od8kd3sd1dd0pd1_ih28oh28kh3sh1dh0ph1_iw28ow28kw3sw1dw0pw1",
    ]
    for i, prb in enumerate(convs):
        wt = "Acdb16a" if i == 0 else ("Abcde8a" if prb.startswith("g") else ("Acdeb8a" if "id8" in prb else "ABcd8b8a"))
        st = "abcde" if "id8" in prb else "aBcd8b"
        for prop, w in (("forward_training", 3.0), ("backward_data", 2.0), ("backward_weights", 2.0)):
            body = (f"convolution,jit:avx2,{prop},"
                    + mds(("src", "f32", st), ("wei", "f32", wt), ("bia", "f32", "a"), ("dst", "f32", st))
                    + f"{sep}alg:convolution_direct,{prb}")
            out.append((body, w))
    for dims in ("32x64x56x56", "32x256x14x14", "32x512x7x7"):
        out.append((f"reorder,jit:blk,undef," + mds(("src", "f32", "abcd"), ("dst", "f32", "aBcd8b")) + f"{sep},{dims}", 2.0))
        out.append((f"eltwise,jit:avx2,forward_training," + mds(("data", "f32", "aBcd8b")) + f"{sep}alg:eltwise_relu alpha:0 beta:0,{dims}", 2.0))
        out.append((f"eltwise,jit:avx2,backward_data," + mds(("data", "f32", "aBcd8b"), ("diff", "f32", "aBcd8b")) + f"{sep}alg:eltwise_relu alpha:0 beta:0,{dims}", 1.5))
        mb, c, h, w_ = dims.split("x")
        out.append((f"batch_normalization,bnorm_jit:avx2,forward_training," + mds(("data", "f32", "aBcd8b")) + f"{sep}flags:CH,mb{mb}ic{c}ih{h}iw{w_}", 1.5))
        out.append((f"batch_normalization,bnorm_jit:avx2,backward," + mds(("data", "f32", "aBcd8b"), ("diff", "f32", "aBcd8b")) + f"{sep}flags:CH,mb{mb}ic{c}ih{h}iw{w_}", 1.5))
        out.append((f"binary,jit:uni,undef," + mds(("src", "f32", "aBcd8b"), ("src", "f32", "aBcd8b"), ("dst", "f32", "aBcd8b")) + f"{sep}alg:binary_add,{dims}:{dims}", 0.8))
        out.append((f"sum,simple:any,undef," + mds(("src", "f32", "aBcd8b"), ("src", "f32", "aBcd8b"), ("dst", "f32", "aBcd8b")) + f"{sep},{dims}", 0.5))
    out.append(("pooling,jit:avx2,forward_training," + mds(("src", "f32", "aBcd8b"), ("dst", "f32", "aBcd8b")) + f"{sep}alg:pooling_max,mb32ic64_ih112oh56kh3sh2dh0ph1_iw112ow56kw3sw2dw0pw1", 0.5))
    out.append(("pooling,jit:avx2,backward_data," + mds(("src", "f32", "aBcd8b"), ("dst", "f32", "aBcd8b")) + f"{sep}alg:pooling_max,mb32ic64_ih112oh56kh3sh2dh0ph1_iw112ow56kw3sw2dw0pw1", 0.5))
    out.append(("inner_product,brg_matmul:avx2,forward_training," + mds(("src", "f32", "ab"), ("wei", "f32", "ab"), ("bia", "f32", "a"), ("dst", "f32", "ab")) + f"{sep},mb32ic2048oc1000", 0.5))
    out.append(("inner_product,brg_matmul:avx2,backward_data," + mds(("src", "f32", "ab"), ("wei", "f32", "ab"), ("bia", "undef", "undef"), ("dst", "f32", "ab")) + f"{sep},mb32ic2048oc1000", 0.5))
    out.append(("matmul,brg_matmul:avx2,undef," + mds(("src", "f32", "abc"), ("wei", "f32", "abc"), ("dst", "f32", "abc")) + f"{sep},12x128x64:12x64x128", 1.0))
    out.append(("softmax,jit:avx2,forward_training," + mds(("src", "f32", "abc"), ("dst", "f32", "abc")) + f"{sep}alg:softmax_accurate axis:2,12x128x128", 0.7))
    out.append(("layer_normalization,jit:uni,forward_training," + mds(("src", "f32", "abc"), ("dst", "f32", "abc")) + f"{sep}flags:CH,32x128x768", 0.7))
    out.append(("concat,simple:any,undef," + mds(("src", "f32", "abcd"), ("src", "f32", "abcd"), ("dst", "f32", "abcd")) + f"{sep}axis:1,32x64x28x28:32x64x28x28", 0.3))
    return out


def write_log(path: Path, n_lines: int, seed: int = 0) -> int:
    """Write a realistic verbose log of ``n_lines`` lines; returns its size in bytes."""
    rng = random.Random(seed)
    tables = {style: _bodies(style) for _, _, style, _ in _HEADERS}
    header_w = [w for *_, w in _HEADERS]
    ts = 1_700_000_000_000.0
    size = 0
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        fh.write("onednn_verbose,v1,info,oneDNN v3.12.0 (commit 80afa71049cd69a3df32adcccb623b12cd7baa22)\n")
        fh.write("onednn_verbose,v1,primitive,info,template:timestamp,operation,engine,primitive,"
                 "implementation,prop_kind,memory_descriptors,attributes,auxiliary,problem_desc,exec_time\n")
        lines = []
        for i in range(n_lines - 2):
            r = rng.random()
            if r < 0.01:
                lines.append(f"epoch 0 step {i} loss {rng.random():.4f}\n")
                continue
            if r < 0.012:
                lines.append(f"profilednn_mark,step,{i}\n")
                continue
            _, head, style, _ = rng.choices(_HEADERS, weights=header_w)[0]
            bodies = tables[style]
            body = rng.choices([b for b, _ in bodies], weights=[w for _, w in bodies])[0]
            event = "exec" if rng.random() > 0.03 else ("create:cache_miss" if style != "v0" else "create")
            ts += rng.random() * 0.5
            prefix = head.format(ts=f"{ts:.6f}", event=event)  # MKL-DNN 0.x: no engine field
            lines.append(f"{prefix}{body},{rng.random() * 3:.6g}\n")
            if len(lines) >= 50_000:
                fh.write("".join(lines))
                lines.clear()
        fh.write("".join(lines))
        size = fh.tell()
    return size


_CHILD = r"""
import json, resource, sys, time
from profilednn.verbose import breakdown, read_log_with_report, scan_log
mode, path = sys.argv[1], sys.argv[2]
cpu0 = resource.getrusage(resource.RUSAGE_SELF)
t0 = time.perf_counter()
if mode == "table":   # the full primitive table (every column, one row per line), then a breakdown
    table, report = read_log_with_report(path)
    bd = breakdown(table)
    rows = table.height
else:                 # what `profilednn breakdown LOG` does: no per-line table
    log = scan_log(path)
    bd = breakdown(log)
    report, rows = log.report, int(log.events.height)
t1 = time.perf_counter()
cpu1 = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({
    "seconds": t1 - t0,
    "cpu_s": (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime),
    "rows": rows, "groups": bd.height, "summary": report.summary(),
    "rss_mb": cpu1.ru_maxrss / 1024,
}))
"""


def _run_child(mode: str, log: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, mode, str(log)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"benchmark child failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _measure(mode: str, log: Path, repeats: int, title: str) -> tuple[float, float]:
    _run_child(mode, log)  # warm-up: page cache, imports, .pyc
    runs = [_run_child(mode, log) for _ in range(repeats)]
    secs = sorted(r["seconds"] for r in runs)
    cpu = statistics.median(r["cpu_s"] for r in runs)
    rss = max(r["rss_mb"] for r in runs)
    med = statistics.median(secs)
    print(f"{title}, {repeats} runs after a warm-up:")
    print(f"  wall median {med:.3f} s   min {secs[0]:.3f} s   max {secs[-1]:.3f} s   "
          f"spread (max-min)/median {(secs[-1] - secs[0]) / med:.0%}   CPU median {cpu:.2f} s")
    print(f"  peak RSS {rss:.0f} MB   rows {runs[0]['rows']:,}   breakdown groups {runs[0]['groups']}")
    return med, rss


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    ap.add_argument("--gigabyte", action="store_true", help="also stream a ~1 GB log (lean path)")
    ap.add_argument("--keep", type=Path, help="directory to keep the generated logs in")
    args = ap.parse_args(argv)

    tmp = tempfile.TemporaryDirectory(prefix="bench_parse_")
    where = args.keep or Path(tmp.name)
    where.mkdir(parents=True, exist_ok=True)
    log = where / "bench_1m.log"
    t = time.perf_counter()
    size = write_log(log, args.lines)
    print(f"wrote {args.lines:,} lines ({size / 2**20:.0f} MiB) in {time.perf_counter() - t:.1f} s: {log}")

    med, rss = _measure("table", log, args.repeats, "read_log (full table) + breakdown")
    lean_med, lean_rss = _measure("lean", log, args.repeats, "scan_log + breakdown (what `profilednn breakdown` runs)")
    print(f"  {_run_child('lean', log)['summary']}")
    ok = med <= TARGET_S and rss <= TARGET_RSS_MB and lean_med <= TARGET_S and lean_rss <= TARGET_RSS_MB
    print(f"targets (both paths): median <= {TARGET_S} s, peak RSS <= {TARGET_RSS_MB:.0f} MB -> "
          f"{'met' if ok else 'MISSED'}  (other processes on the machine inflate wall times)")

    if args.gigabyte:
        big = where / "bench_1g.log"
        n = int(args.lines * (2**30 / size))
        t = time.perf_counter()
        bsize = write_log(big, n, seed=1)
        print(f"wrote {n:,} lines ({bsize / 2**30:.2f} GiB) in {time.perf_counter() - t:.1f} s")
        r = _run_child("lean", big)
        print(f"  1 GB log, scan_log + breakdown: {r['seconds']:.2f} s, peak RSS {r['rss_mb']:.0f} MB, "
              f"{r['rows']:,} primitive lines")
        big.unlink()
    tmp.cleanup()
    if args.strict and not ok:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

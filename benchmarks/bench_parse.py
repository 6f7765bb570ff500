"""Benchmark: parse + decode + breakdown of a realistic 1,000,000-line verbose log.

Writes a log mixing drivers (conv fwd/bwd, reorder, batch norm, eltwise, pooling, inner
product, matmul, softmax, binary, sum, concat, layer norm) and dialects (oneDNN 3.6+
with timestamps, 3.3, 2.5, DNNL 1.x, MKL-DNN 0.x) with interleaved program output and
ProfileDNN marker lines, then times two paths over several repeats, each run in a fresh
subprocess (so peak RSS is per run):

* ``read_log`` (parse + decode into the full primitive table) + ``breakdown``;
* ``scan_totals`` + ``breakdown`` -- the one-pass path ``profilednn breakdown`` takes
  (per-shape totals straight from the mapped file, no per-line rows).

Target on the project's 2-core machine: median <= 2 s and peak RSS <= 1 GB for both.

Two comparisons, each run interleaved (A, B, A, B ...) so machine load hits both alike:

* start-up: ``profilednn --help`` against ``python -c "import polars"`` (target <= 2x);
* ``--converter PATH``: the CLI, ``profilednn breakdown LOG --by prim_kind,prop_kind,problem
  --event exec --csv``, against oneDNN's own ``scripts/verbose_converter`` (``-g breakdown
  -k prim_kind prop_kind shapes -e exec``), both as fresh processes, start-up included
  (target: ours >= 15x faster). PATH is the ``scripts/verbose_converter`` folder of a
  oneDNN checkout (``git clone https://github.com/uxlfoundation/oneDNN``); nothing of it
  ships with ProfileDNN. The converter reads only ``onednn_verbose`` lines, so its groups,
  calls and times are checked against ours on those lines.

The first pass over each chunk is the C scan (``scan_lines.c``, built with the system
compiler on first use) where it can be built, else the NumPy scan; the header says which
(``PROFILEDNN_VERBOSE_NATIVE=0`` forces the NumPy one, and ``scan_totals`` then runs the
per-line reader).

``--strict`` exits non-zero when a target is missed.

    .venv/bin/python benchmarks/bench_parse.py [--lines 1000000] [--repeats 5] [--strict]
    .venv/bin/python benchmarks/bench_parse.py --converter ~/oneDNN/scripts/verbose_converter
    .venv/bin/python benchmarks/bench_parse.py --gigabyte   # also a ~1 GB log, lean path
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 2.0
TARGET_RSS_MB = 1024.0
TARGET_SPEEDUP = 15.0   # ours vs oneDNN's verbose_converter, start-up included
TARGET_STARTUP = 2.0    # `profilednn --help` vs `python -c "import polars"`
BREAKDOWN_KEYS = ("prim_kind", "prop_kind", "problem")
CONVERTER_KEYS = ("prim_kind", "prop_kind", "shapes")  # the converter's names for the same fields

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
from profilednn.verbose import breakdown, read_log_with_report, scan_totals
mode, path = sys.argv[1], sys.argv[2]
cpu0 = resource.getrusage(resource.RUSAGE_SELF)
t0 = time.perf_counter()
if mode == "table":   # the full primitive table (every column, one row per line), then a breakdown
    table, report = read_log_with_report(path)
    bd = breakdown(table)
    rows = table.height
else:                 # what `profilednn breakdown LOG` does: per-shape totals, no per-line rows
    totals = scan_totals(path)
    bd = breakdown(totals)
    report, rows = totals.report, totals.report.primitives
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


def _profilednn_cmd() -> list[str]:
    """The installed ``profilednn`` entry point (what a user runs), else ``python -m``."""
    script = Path(sys.executable).with_name("profilednn")
    return [str(script)] if script.exists() else [sys.executable, "-m", "profilednn"]


CPU_SECONDS: dict[str, list[float]] = {}  # per command name: user+sys CPU of each timed run


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(cmd: list[str], stdout_path: Path | None = None, name: str | None = None) -> float:
    """Wall seconds of one fresh process (stdout to a file or discarded); fails loudly.
    With ``name``, its CPU seconds (all threads) are appended to ``CPU_SECONDS[name]``."""
    cpu = _children_cpu()
    t = time.perf_counter()
    with open(stdout_path, "w") if stdout_path else open(os.devnull, "w") as out:
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.PIPE, text=True, check=False)
    elapsed = time.perf_counter() - t
    if name is not None:
        CPU_SECONDS.setdefault(name, []).append(_children_cpu() - cpu)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return elapsed


def _interleaved(cmds: dict[str, list[str]], repeats: int, outs: dict[str, Path] | None = None) -> dict[str, list[float]]:
    """Run each command once to warm up, then ``repeats`` rounds of all of them in turn."""
    outs = outs or {}
    for name, cmd in cmds.items():
        _timed(cmd, outs.get(name))
    times: dict[str, list[float]] = {name: [] for name in cmds}
    for _ in range(repeats):
        for name, cmd in cmds.items():
            times[name].append(_timed(cmd, outs.get(name), name))
    return times


def _describe(name: str, secs: list[float]) -> str:
    med = statistics.median(secs)
    return (f"{name}: median {med:.3f} s  min {min(secs):.3f}  max {max(secs):.3f}  "
            f"spread {(max(secs) - min(secs)) / med:.0%}")


def measure_startup(repeats: int) -> float:
    """Median ratio of `profilednn --help` to `python -c "import polars"` (interleaved)."""
    times = _interleaved({"import polars": [sys.executable, "-c", "import polars"],
                          "profilednn --help": [*_profilednn_cmd(), "--help"]}, repeats)
    ratios = [h / p for h, p in zip(times["profilednn --help"], times["import polars"])]
    print(f"start-up, {repeats} interleaved rounds after a warm-up:")
    for name, secs in times.items():
        print(f"  {_describe(name, secs)}")
    ratio = statistics.median(times["profilednn --help"]) / statistics.median(times["import polars"])
    print(f"  --help / import polars: {ratio:.2f}x (median of per-round ratios {statistics.median(ratios):.2f}x; "
          f"target <= {TARGET_STARTUP:.0f}x)")
    return ratio


def _converter_script(path: Path) -> Path:
    script = path / "verbose_converter.py" if path.is_dir() else path
    if not script.is_file():
        raise SystemExit(f"--converter: no verbose_converter.py at {path} "
                         "(give the scripts/verbose_converter folder of a oneDNN checkout)")
    return script


def read_converter_csv(path: Path) -> dict[tuple[str, ...], tuple[int, float]]:
    """The converter's breakdown: (prim_kind, prop_kind, shapes) -> (ncalls, time_ms)."""
    rows = [line for line in path.read_text().splitlines() if line and not line.startswith("Event:")]
    header = rows[0].split(",")
    nk = len(CONVERTER_KEYS)
    if tuple(header[:nk]) != CONVERTER_KEYS:
        raise SystemExit(f"unexpected converter header: {rows[0]}")
    out = {}
    for line in rows[1:]:
        fields = line.split(",")
        out[tuple(fields[:nk])] = (int(fields[nk]), float(fields[nk + 1]))
    return out


def read_our_csv(path: Path) -> dict[tuple[str, ...], tuple[int, float]]:
    """The CLI's ``breakdown --csv`` output: (prim_kind, prop_kind, problem) -> (ncalls, time_ms)."""
    import csv

    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    nk = len(BREAKDOWN_KEYS)
    if tuple(rows[0][:nk]) != BREAKDOWN_KEYS:
        raise SystemExit(f"unexpected header in {path}: {rows[0]}")
    return {tuple(r[:nk]): (int(r[nk]), float(r[nk + 1])) for r in rows[1:]}


_GROUPS_CHILD = r"""
import json, sys
import polars as pl
from profilednn.verbose import breakdown, read_log
keys = tuple(sys.argv[2].split(","))
table = read_log(sys.argv[1])
def groups(t):
    return [["" if v is None else v for v in r[:3]] + [int(r[3]), float(r[4])] for r in breakdown(t, keys, "exec").iter_rows()]
onednn = table.filter(pl.col("dialect").str.starts_with("onednn_"))
skipped = table.filter(~pl.col("dialect").str.starts_with("onednn_") & (pl.col("event") == "exec")).height
print(json.dumps({"all": groups(table), "onednn": groups(onednn), "skipped": skipped}))
"""


def full_table_groups(log: Path):
    """The full parser's breakdown (read_log: every line decoded, per-line table) of all
    lines and of the lines the converter reads (``onednn_verbose``), and how many exec
    lines only we read. Run in a child: a parent grown by the full table would pass its
    peak RSS on to the children timed after it (Linux keeps ``ru_maxrss`` across exec)."""
    out = subprocess.run([sys.executable, "-c", _GROUPS_CHILD, str(log), ",".join(BREAKDOWN_KEYS)],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"full-table breakdown failed:\n{out.stderr}")
    got = json.loads(out.stdout.strip().splitlines()[-1])

    def groups(rows: list) -> dict[tuple[str, ...], tuple[int, float]]:
        return {tuple(r[:3]): (int(r[3]), float(r[4])) for r in rows}

    return groups(got["all"]), groups(got["onednn"]), int(got["skipped"])


def compare_groups(ours: dict, theirs: dict, tolerance: float = 0.0051,
                   names: tuple[str, str] = ("ours", "the converter")) -> list[str]:
    """Differences between two breakdowns (the converter prints times to 0.01 ms, the CLI to 1e-6)."""
    problems = []
    for key in sorted(set(ours) | set(theirs)):
        if key not in ours or key not in theirs:
            problems.append(f"group {key} only in {names[0] if key in ours else names[1]}")
            continue
        (n1, t1), (n2, t2) = ours[key], theirs[key]
        if n1 != n2 or abs(t1 - t2) > tolerance:
            problems.append(f"group {key}: {names[0]} {n1} calls {t1:.6f} ms, {names[1]} {n2} calls {t2:.6f} ms")
    return problems


def measure_converter(log: Path, converter: Path, repeats: int, where: Path) -> float:
    """Interleaved wall times of our CLI breakdown and oneDNN's converter; the speed-up."""
    script = _converter_script(converter)
    ours_cmd = [*_profilednn_cmd(), "breakdown", str(log), "--by", ",".join(BREAKDOWN_KEYS), "--event", "exec", "--csv"]
    conv_cmd = [sys.executable, str(script), "-i", str(log), "-g", "breakdown",
                "-k", *CONVERTER_KEYS, "-e", "exec"]
    outs = {"profilednn breakdown": where / "ours.csv", "verbose_converter": where / "converter.csv"}
    times = _interleaved({"profilednn breakdown": ours_cmd, "verbose_converter": conv_cmd}, repeats, outs)
    ours_s, conv_s = (statistics.median(times[k]) for k in outs)
    ratios = [c / o for o, c in zip(times["profilednn breakdown"], times["verbose_converter"])]
    print(f"breakdown --by {','.join(BREAKDOWN_KEYS)} --event exec --csv vs oneDNN's verbose_converter "
          f"({script}), fresh processes, start-up included, {repeats} interleaved rounds after a warm-up:")
    for name, secs in times.items():
        print(f"  {_describe(name, secs)}")
    speedup = conv_s / ours_s
    print(f"  speed-up: {speedup:.1f}x (median of per-round ratios {statistics.median(ratios):.1f}x; "
          f"target >= {TARGET_SPEEDUP:.0f}x)")
    ours_cpu, conv_cpu = (statistics.median(CPU_SECONDS[k]) for k in outs)
    print(f"  CPU seconds (user+sys, all threads; less sensitive to other load): ours {ours_cpu:.2f}, "
          f"converter {conv_cpu:.2f}: {conv_cpu / ours_cpu:.1f}x")
    everything, ours, skipped = full_table_groups(log)
    cli = read_our_csv(outs["profilednn breakdown"])
    cli_diffs = compare_groups(cli, everything, tolerance=1.01e-6, names=("the CLI", "the full table"))
    if cli_diffs:
        print(f"  MISMATCH of the timed CLI output with the full per-line table ({len(cli_diffs)}): "
              + "; ".join(cli_diffs[:5]))
    else:
        print(f"  the timed CLI output equals the full per-line table's breakdown: {len(cli)} groups, "
              f"{sum(n for n, _ in cli.values()):,} calls, times to 1e-6 ms")
    theirs = read_converter_csv(outs["verbose_converter"])
    diffs = compare_groups(ours, theirs) + cli_diffs
    calls = sum(n for n, _ in theirs.values())
    if diffs:
        print(f"  MISMATCH with the converter ({len(diffs)}): " + "; ".join(diffs[:5]))
    else:
        print(f"  same {len(theirs)} groups, {calls:,} calls and times (to 0.01 ms) on the onednn_verbose lines; "
              f"ours also counts {skipped:,} dnnl/mkldnn exec lines the converter skips")
    return speedup if not diffs else 0.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    ap.add_argument("--gigabyte", action="store_true", help="also stream a ~1 GB log (lean path)")
    ap.add_argument("--keep", type=Path, help="directory to keep the generated logs in")
    ap.add_argument("--converter", type=Path,
                    help="oneDNN's scripts/verbose_converter folder: also time it against `profilednn breakdown`")
    ap.add_argument("--skip-api", action="store_true", help="skip the in-process read_log/scan_log timings")
    args = ap.parse_args(argv)

    tmp = tempfile.TemporaryDirectory(prefix="bench_parse_")
    where = args.keep or Path(tmp.name)
    where.mkdir(parents=True, exist_ok=True)
    log = where / f"bench_{args.lines}.log"
    if args.keep and log.exists():  # the generator is seeded: a kept log is the same log
        size = log.stat().st_size
        print(f"reusing {log} ({size / 2**20:.0f} MiB)")
    else:
        t = time.perf_counter()
        size = write_log(log, args.lines)
        print(f"wrote {args.lines:,} lines ({size / 2**20:.0f} MiB) in {time.perf_counter() - t:.1f} s: {log}")

    print(f"machine load (uptime): {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    from profilednn.verbose.native_scan import unavailable_reason

    why = unavailable_reason()
    print(f"first pass: {'the C scan (scan_lines.c)' if why is None else f'the NumPy scan ({why})'}, {os.cpu_count()} CPUs")
    ok = measure_startup(max(args.repeats, 5)) <= TARGET_STARTUP
    if args.converter is not None:
        ok &= measure_converter(log, args.converter, args.repeats, where) >= TARGET_SPEEDUP
    if not args.skip_api:
        med, rss = _measure("table", log, args.repeats, "read_log (full table) + breakdown")
        lean_med, lean_rss = _measure("lean", log, args.repeats, "scan_totals + breakdown (what `profilednn breakdown` runs)")
        print(f"  {_run_child('lean', log)['summary']}")
        api_ok = med <= TARGET_S and rss <= TARGET_RSS_MB and lean_med <= TARGET_S and lean_rss <= TARGET_RSS_MB
        print(f"targets (both paths): median <= {TARGET_S} s, peak RSS <= {TARGET_RSS_MB:.0f} MB -> "
              f"{'met' if api_ok else 'MISSED'}  (other processes on the machine inflate wall times)")
        ok &= api_ok
    print(f"machine load (uptime) at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")

    if args.gigabyte:
        big = where / "bench_1g.log"
        n = int(args.lines * (2**30 / size))
        t = time.perf_counter()
        bsize = write_log(big, n, seed=1)
        print(f"wrote {n:,} lines ({bsize / 2**30:.2f} GiB) in {time.perf_counter() - t:.1f} s")
        r = _run_child("lean", big)
        print(f"  1 GB log, scan_totals + breakdown: {r['seconds']:.2f} s, peak RSS {r['rss_mb']:.0f} MB, "
              f"{r['rows']:,} primitive lines")
        big.unlink()
    tmp.cleanup()
    if args.strict and not ok:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The vectorized scan reads fixed windows at each line's head and tail; lines whose
fields fall outside those windows (long timestamps, long time fields, very short lines,
markers behind other text) take slower paths. All must agree with a plain reference
reading of the header rules: ``marker,[vN,][timestamp,][vN,]key,time``."""

from __future__ import annotations

import math
import random
import re

import pytest

from profilednn.verbose.dialects import MARKERS
from profilednn.verbose.native_scan import kernel, unavailable_reason
from profilednn.verbose.scan import scan_chunk, unpack_prefix
from profilednn.verbose.source import iter_chunks

_VERSION = re.compile(r"v\d{1,2}$")


def _reference(line: str) -> tuple[int, bool, str, str, str] | None:
    """(marker id, has version, key, time text, timestamp text) of a verbose line."""
    for text, mid in MARKERS:
        at = line.find(text.decode())
        if at >= 0 and (at == 0 or line.find("_verbose,") == at + len(text) - len("_verbose,")):
            break
    else:
        return None
    rest = line[at + len(text):]
    has_ver = False
    head, _, tail = rest.partition(",")
    if _VERSION.match(head) and "," in rest:
        has_ver, rest = True, tail
    ts = ""
    if rest[:1].isdigit():
        ts, _, rest = rest.partition(",")
        head, _, tail = rest.partition(",")
        if not has_ver and _VERSION.match(head) and "," in rest:
            has_ver, rest = True, tail
    key, comma, time = rest.rpartition(",")
    if not comma:
        key, time = rest, ""
    return mid, has_ver, key, time, ts


def _as_float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return (math.isnan(a) and math.isnan(b)) or a == b


def _lines(rng: random.Random, n: int) -> list[str]:
    heads = ["onednn_verbose,", "onednn_verbose,v1,", "dnnl_verbose,", "mkldnn_verbose,", "[rank3]: onednn_verbose,"]
    out = []
    for _ in range(n):
        head = rng.choice(heads)
        if rng.random() < 0.5:
            head += "1" * rng.choice([1, 13, 20, 70]) + "." + "5" * rng.choice([0, 3, 6]) + ","
            if rng.random() < 0.3 and "v1" not in head:
                head += "v1,"
        body = rng.choice(["exec", "primitive,exec,cpu,reorder", "exec,cpu,convolution,jit:avx2," + "x" * rng.randint(0, 90)])
        time = rng.choice(["0.25", "1", "1e-05", "3" * 40 + ".5", "", "nan", "12,5"])
        out.append(f"{head}{body},{time}" if time else head + body)
    out.append("onednn_verbose,1")
    return out


@pytest.mark.parametrize("native", [True, False], ids=["c-scan", "numpy-scan"])
@pytest.mark.parametrize("seed", [0, 1])
def test_windowed_scan_matches_the_reference_reading(seed: int, native: bool):
    if native and kernel() is None:
        pytest.skip(f"C scan unavailable: {unavailable_reason()}")
    lines = _lines(random.Random(seed), 400)
    chunks = list(iter_chunks(lines, 1 << 12))
    assert len(chunks) > 5  # small chunks: lines at the very start of a chunk are covered too
    got, offset = [], 0
    for chunk in chunks:
        scan = scan_chunk(chunk, native=native)
        rows = scan.frame.select("line", "prefix", "key_s", "key_e", "time", "ts").iter_rows()
        for line, prefix, key_s, key_e, time, ts in rows:
            got.append((line + offset, prefix, scan.key_text(key_s, key_e), time, ts))
        offset += scan.n_lines
    expected = []
    for i, line in enumerate(lines):
        ref = _reference(line)
        if ref is None:
            continue
        mid, has_ver, key, time, ts = ref
        expected.append((i, mid, has_ver, key, _as_float(time), _as_float(ts)))
    assert len(got) == len(expected)
    for (line, prefix, key, time, ts), (i, mid, has_ver, rkey, rtime, rts) in zip(got, expected):
        assert line == i
        assert unpack_prefix(prefix) == (mid, has_ver), lines[i]
        assert key == rkey, lines[i]
        assert _same(time, rtime), lines[i]
        assert _same(ts, rts), lines[i]


def test_breakdowns_skip_timestamps_and_lose_nothing_else():
    from profilednn.verbose import breakdown, scan_log

    rng = random.Random(2)
    lines = [
        f"onednn_verbose,v1,{1.7e12 + i * 0.25:.6f},primitive,exec,cpu,{rng.choice(['reorder', 'eltwise'])},jit:uni,"
        f"undef,src:f32::blocked:ab::f0 dst:f32::blocked:ba::f0,,,8x{rng.randint(1, 4)},{rng.random():.6g}"
        for i in range(300)
    ]
    full, lean = scan_log(lines), scan_log(lines, timestamps=False)
    assert full.events["timestamp_ms"].drop_nulls().len() == 300
    assert lean.events["timestamp_ms"].null_count() == lean.events.height
    assert full.events.drop("timestamp_ms").equals(lean.events.drop("timestamp_ms"))
    assert breakdown(full, ["prim_kind"]).equals(breakdown(lean, ["prim_kind"]))


def test_reused_chunk_buffers_give_the_same_chunks():
    # a consumer hands each chunk's buffer back; later chunks (longer or shorter, with a
    # carried-over line) are read into it and must equal freshly allocated ones
    rng = random.Random(3)
    text = "".join(f"{'x' * rng.choice([1, 40, 900, 5000])},{i}\n" for i in range(600)).encode() + b"tail"
    fresh = [(c.text, c.size, bytes(c.data[c.size:])) for c in iter_chunks(text, 1 << 12)]
    pool: list[bytearray] = []
    reused = []
    for chunk in iter_chunks(text, 1 << 12, pool):
        reused.append((bytes(chunk.text), chunk.size, bytes(chunk.data[chunk.size:])))
        pool.append(chunk.data)
    assert len(fresh) > 20 and reused == fresh

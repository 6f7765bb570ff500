"""The replay worker: a child process that times each replay case alone.

Run as ``python -m profilednn.projection.worker CASES.json RESULTS.json THREADS``
with fd 1 pointed at a file and ``ONEDNN_VERBOSE`` set, so the replay has its own
verbose log, its own thread count and its own core pinning (set before torch loads).
Each case is warmed up, then called repeatedly; marker lines written into the same fd
(``replay,<id>@<attempt>,timed`` ... ``end``, ``verbose/markers.py``) delimit the timed calls, so the
parent can read oneDNN's own per-execution times of each case from the log. Progress
goes to stderr, one ``progress <done> <total>`` line per case.

A case with ``"evict": true`` is timed cold: before each timed call the worker writes a
buffer twice the last-level cache (outside the timer), so the call reads its inputs from
memory as it does inside a training step, where the step's other tensors have pushed
them out (``step_model.py`` measures how much that matters per part).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from ..run import atomic_write_json
from ..verbose.markers import REPLAY_EVENT, write_marker
from ..vocabulary import CONV_BACKWARD_OP, CONV_FORWARD_OP, PROFILER_TENSOR_TYPES, TORCH_DTYPE, cfg_dtype



def _pin(threads: int, cpus: list[int]) -> None:
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus[:threads] if len(cpus) >= threads else cpus)


def _mark(text: str) -> None:
    """A marker line in the verbose stream, after everything oneDNN printed so far."""
    from profilednn.capture.stream import flush_c_stdio

    sys.stdout.flush()
    flush_c_stdio()
    write_marker(f"{REPLAY_EVENT},{text}")


# --------------------------------------------------------------------------- oneDNN cases
def _conv_call(case: dict[str, Any]) -> Callable[[], object]:
    """Convolution / deconvolution in one direction, through aten like PyTorch does."""
    import torch

    gen = torch.Generator().manual_seed(0)
    dt = getattr(torch, TORCH_DTYPE[cfg_dtype(case.get("dtype"))])
    mb, g, ic, oc = case["mb"], case["g"], case["ic"], case["oc"]
    transposed = bool(case.get("transposed"))
    x = torch.randn([mb, ic, *case["in"]], generator=gen).to(dt)
    w_shape = [ic, oc // g, *case["k"]] if transposed else [oc, ic // g, *case["k"]]
    w = torch.randn(w_shape, generator=gen).to(dt)
    out = torch.randn([mb, oc, *case["out"]], generator=gen).to(dt)
    if case.get("channels_last"):
        fmt = {3: torch.channels_last_1d if hasattr(torch, "channels_last_1d") else None,
               4: torch.channels_last, 5: torch.channels_last_3d}[x.dim()]
        if fmt is not None:
            x, w, out = (t.contiguous(memory_format=fmt) for t in (x, w, out))
    b = torch.randn(oc, generator=gen).to(dt) if case.get("bias") else None
    stride, padding, dilation = case["s"], case["p"], case["d"]
    out_pad = case.get("output_padding") or [0] * len(stride)
    direction = case["direction"]
    aten = torch.ops.aten
    if direction.startswith("FWD"):
        return lambda: aten.convolution(x, w, b, stride, padding, dilation, transposed, out_pad, g)
    mask = {"BWD_D": [True, False, False], "BWD_W": [False, True, False],
            "BWD_WB": [False, True, True], "BWD_DW": [True, True, False],
            "BWD_DWB": [True, True, True]}[direction]
    bias_sizes = [oc] if mask[2] else None
    return lambda: aten.convolution_backward(out, x, w, bias_sizes, stride, padding, dilation,
                                             transposed, out_pad, g, mask)


def _matmul_call(case: dict[str, Any]) -> Callable[[], object]:
    import torch

    gen = torch.Generator().manual_seed(0)
    dt = getattr(torch, TORCH_DTYPE[cfg_dtype(case.get("dtype"))])
    a = torch.randn(case["a"], generator=gen).to(dt)
    b = torch.randn(case["b"], generator=gen).to(dt)
    return lambda: torch.matmul(a, b)


def _mkldnn_call(case: dict[str, Any]) -> Callable[[], object]:
    """Primitives PyTorch runs through oneDNN only on oneDNN (``to_mkldnn``) tensors."""
    import torch
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(0)
    dims = case["dims"]
    x = torch.randn(dims, generator=gen).to_mkldnn()
    kind = case["kind"]
    if kind == "reorder_to_blocked":
        dense = torch.randn(dims, generator=gen)
        return lambda: dense.to_mkldnn()
    if kind == "reorder_to_plain":
        return lambda: x.to_dense()
    if kind == "eltwise_relu":
        return lambda: torch.relu(x)
    if kind == "binary_add":
        y = torch.randn(dims, generator=gen).to_mkldnn()
        return lambda: torch.add(x, y)
    if kind in ("pool_max", "pool_avg"):
        pool = F.max_pool2d if kind == "pool_max" else F.avg_pool2d
        return lambda: pool(x, case["k"], case["s"], case["p"])
    if kind == "bnorm_inference":
        c = dims[1]
        w, bb, rm, rv = (torch.ones(c), torch.zeros(c), torch.zeros(c), torch.ones(c))
        return lambda: torch.batch_norm(x, w, bb, rm, rv, False, 0.1, 1e-5, False)
    if kind == "softmax":
        return lambda: torch._softmax(x, case.get("axis", -1), False)
    raise ValueError(f"unknown oneDNN tensor case {kind!r}")


# --------------------------------------------------------------------------- framework ops
def _is_tensor_type(t: str) -> bool:
    return t in ("Tensor", "Optional[Tensor]")


def _default_for(arg: Any, name: str, t: str, ctx: dict[str, Any]) -> Any:
    """A value for a non-tensor argument the profiler did not record."""
    params = ctx["params"]
    if name in params:
        return params[name]
    if t.startswith("List[bool]"):
        return [True, True, True]
    if name in ("eps",):
        return 1e-5
    if name == "momentum":
        return 0.1
    if name in ("training", "train"):
        return True
    if name in ("threshold",):
        return 0.0
    if name == "dilation":
        return [1, 1]
    if name == "ceil_mode":
        return False
    if name == "reduction":
        return 1
    if name == "ignore_index":
        return -100
    if arg.has_default_value():
        return arg.default_value
    if name == "dim" and "int" in t:
        return [-1] if t.startswith(("List", "Optional[List")) else -1
    if t in ("bool",):
        return False
    if t in ("float", "number", "Scalar"):
        return 1.0
    if t in ("int", "SymInt"):
        return 0
    if t.startswith(("Optional",)):
        return None
    if t.startswith("List"):
        return []
    raise ValueError(f"no value for argument {name}: {t}")


def _tensor(shape: list[int], dtype: str, name: str, ctx: dict[str, Any]) -> Any:
    import torch

    gen = ctx["gen"]
    tdt = getattr(torch, PROFILER_TENSOR_TYPES[dtype])
    if tdt in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        high = int(ctx["params"].get(f"{name}_high", ctx["params"].get("classes", 2)))
        if name == "indices":
            return None  # built from a forward call by the caller
        return torch.randint(0, max(high, 1), shape, generator=gen, dtype=tdt)
    if tdt == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    t = torch.randn(shape, generator=gen).to(tdt)
    if name in ("running_var", "save_invstd", "rstd"):
        t = t.abs() + 0.5
    return t


def _op_args(schema: Any, shapes: list, dtypes: list, ctx: dict[str, Any]
             ) -> tuple[list[Any], dict[str, Any]] | None:
    """(args, kwargs) for ``schema`` from the recorded shapes/dtypes; None if they don't fit."""
    args = list(schema.arguments)
    if len(args) != len(shapes):
        return None
    out: list[Any] = []
    for arg, shape, dtype in zip(args, shapes, dtypes):
        t = str(arg.type)
        recorded_tensor = dtype in PROFILER_TENSOR_TYPES and isinstance(shape, list) and (
            len(shape) > 0 or dtype not in ("double", "long int", "bool"))
        if _is_tensor_type(t):
            if dtype == "":
                if t.startswith("Optional"):
                    out.append(None)
                    continue
                return None
            if dtype not in PROFILER_TENSOR_TYPES or not isinstance(shape, list):
                return None
            if shape and isinstance(shape[0], list):
                return None
            out.append(_tensor(shape, dtype, arg.name, ctx))
        elif t.startswith("List[Tensor]"):
            if not (isinstance(shape, list) and all(isinstance(s, list) for s in shape)):
                return None
            out.append([_tensor(s, "float", arg.name, ctx) for s in shape])
        else:
            if recorded_tensor and shape:
                return None  # a real tensor where the schema wants a scalar
            out.append(_default_for(arg, arg.name, t, ctx))
    positional = [v for a, v in zip(args, out) if not a.kwarg_only]
    keywords = {a.name: v for a, v in zip(args, out) if a.kwarg_only}
    return positional, keywords


def _op_call(case: dict[str, Any]) -> tuple[Callable[[], object], str]:
    """The framework op at its recorded shapes: the first overload whose schema fits."""
    import torch

    name = case["op"].split("::", 1)[1]
    packet = getattr(torch.ops.aten, name)
    errors = []
    for overload in packet.overloads():
        fn = getattr(packet, overload)
        ctx = {"gen": torch.Generator().manual_seed(0), "params": dict(case.get("params") or {})}
        built = _op_args(fn._schema, case["shapes"], case["dtypes"], ctx)
        if built is None:
            continue
        args, kwargs = built
        names = [a.name for a in fn._schema.arguments if not a.kwarg_only]
        if "indices" in names:
            i = names.index("indices")
            p = ctx["params"]
            _, idx = torch.ops.aten.max_pool2d_with_indices(
                args[1], p["kernel_size"], p["stride"], p["padding"], p.get("dilation", [1, 1]),
                p.get("ceil_mode", False))
            args[i] = idx
        try:
            fn(*args, **kwargs)
        except Exception as exc:  # this overload does not take these values: try the next
            errors.append(f"{overload}: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
            continue
        return (lambda: fn(*args, **kwargs)), overload
    raise ValueError("no overload fits the recorded shapes"
                     + (f" ({'; '.join(errors)})" if errors else ""))


# --------------------------------------------------------------------------- timing
def _build(case: dict[str, Any]) -> tuple[Callable[[], object], str]:
    kind = case["kind"]
    if kind == "conv":
        return _conv_call(case), CONV_FORWARD_OP if case["direction"].startswith("FWD") else CONV_BACKWARD_OP
    if kind == "matmul":
        return _matmul_call(case), "aten::matmul"
    if kind == "op":
        fn, overload = _op_call(case)
        return fn, f"{case['op']}.{overload}"
    return _mkldnn_call(case), f"to_mkldnn:{kind}"


def llc_bytes(default: int = 32 << 20) -> int:
    """The largest cache the detected CPU reports (sysfs), in bytes; ``default`` where it
    reports none."""
    from ..topology import detected_topology

    return detected_topology().llc_bytes or default


class CacheEvictor:
    """Writes a buffer of ``nbytes`` (default: the last-level cache sysfs reports) before a
    call: what a call finds cached inside a step (``replay_cache.py`` says how much)."""

    def __init__(self, nbytes: int | None = None) -> None:
        import torch

        self.nbytes = int(nbytes or llc_bytes())
        self.buffer = torch.zeros(max(self.nbytes // 4, 1), dtype=torch.float32)

    def __call__(self) -> None:
        self.buffer.add_(1.0)


def _timed_attempt(fn: Callable[[], object], segment: str, reps: int,
                   before: Callable[[], None] | None = None) -> list[float]:
    times = []
    _mark(f"{segment},timed")
    for _ in range(reps):
        if before is not None:
            before()
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    _mark(f"{segment},end")
    return times


def _time_case(case: dict[str, Any], budget_s: float, min_reps: int, max_reps: int,
               attempts: int = 3, spread: float = 3.0,
               evictor: Callable[[], None] | None = None) -> dict:
    """Warm up, then time; an attempt whose median is over ``spread`` x its minimum was
    disturbed (another process took a core from an OpenMP thread) and is tried again,
    up to ``attempts`` times; the attempt with the lowest median is kept. A case with
    ``evict`` runs ``evictor`` before each call (outside the timer)."""
    fn, call = _build(case)
    before = evictor if case.get("evict") else None
    t0 = time.perf_counter()
    n = 0
    while n < 3 or (time.perf_counter() - t0 < min(0.05, budget_s / 4) and n < 50):
        if before is not None:
            before()
        fn()
        n += 1
    one = (time.perf_counter() - t0) / n
    reps = int(max(min_reps, min(max_reps, budget_s / max(one, 1e-6))))
    best: tuple[float, str, list[float]] | None = None
    for attempt in range(attempts):
        segment = f"{case['id']}@{attempt}"
        times = _timed_attempt(fn, segment, reps, before)
        med = sorted(times)[len(times) // 2]
        if best is None or med < best[0]:
            best = (med, segment, times)
        if med <= spread * min(times):
            break
    assert best is not None
    out = {"id": case["id"], "call": call, "wall_ms": best[2], "segment": best[1],
           "attempts": attempt + 1, "evicted": before is not None}
    if case.get("profile_ops"):
        out["ops"] = _ops_run(fn)
    return out


def _ops_run(fn: Callable[[], object], top: int = 6) -> list[tuple[str, float]]:
    """The aten ops one call runs (name, self ms), largest first: which path PyTorch took."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    ops = sorted(((e.key, e.self_cpu_time_total / 1e3) for e in prof.key_averages()),
                 key=lambda kv: -kv[1])
    return [(k, round(v, 4)) for k, v in ops[:top]]


def main(argv: list[str]) -> int:
    cases_path, results_path, threads = argv[0], argv[1], int(argv[2])
    spec = json.loads(open(cases_path, encoding="utf-8").read())
    _pin(threads, spec.get("cpus") or [])
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    results, cases = [], spec["cases"]
    budget, lo, hi = spec.get("budget_s", 0.25), spec.get("min_reps", 5), spec.get("max_reps", 50)
    evictor = CacheEvictor(spec.get("evict_bytes")) if any(c.get("evict") for c in cases) else None
    with torch.no_grad():
        for i, case in enumerate(cases):
            try:
                results.append(_time_case(case, budget, lo, hi, evictor=evictor))
            except Exception as exc:  # one case failing must not lose the others: reported
                results.append({"id": case["id"], "error": f"{type(exc).__name__}: "
                                f"{str(exc).splitlines()[0] if str(exc) else ''}"[:400],
                                "traceback": traceback.format_exc(limit=3)})
            print(f"progress {i + 1} {len(cases)}", file=sys.stderr, flush=True)
    env = {"threads": torch.get_num_threads(), "evict_bytes": evictor.nbytes if evictor else None,
           "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None}
    atomic_write_json(Path(results_path), {"results": results, "env": env})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

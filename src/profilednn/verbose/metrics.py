"""Per-primitive figures: benchdnn cfg, operation counts and compulsory memory traffic.

* ``flops`` follows benchdnn: convolutions count 2 * MACs *excluding* kernel taps that
  fall into padding (``conv::prb_t::count_ops``); inner product 2*mb*ic*oc*spatial;
  matmul 2*batch*M*N*K. Drivers benchdnn counts no operations for get ``None``.
* ``flops_dense`` counts 2 * MACs over the full kernel window (torch.utils.flop_counter).
* ``bytes`` is compulsory traffic: every tensor the primitive reads or writes, once,
  sized from the descriptor dims times the tensor's data type, for the direction run
  (conv ``BWD_D`` reads diff_dst and weights and writes diff_src). Small side tensors
  are approximated (matmul bias as N elements, normalization statistics as 2-4 channel
  vectors); RNN traffic is not modelled (``None``).
"""

from __future__ import annotations

import math

from ..vocabulary import COMPUTE_DRIVERS, CONV_DRIVERS
from .mds import MemoryDesc, Roles
from .problem import Problem, conv_flops, conv_flops_dense

GEMM_DRIVERS = COMPUTE_DRIVERS  # the drivers with weights (src, wei, dst)


def benchdnn_cfg(driver: str | None, r: Roles) -> str | None:
    """benchdnn's cfg name: one data type when all agree, else their concatenation."""
    def dt(md: MemoryDesc | None) -> str | None:
        if md is None:
            return None
        return md.dt or "f32"

    if driver in GEMM_DRIVERS:
        dts = [dt(r.src), dt(r.wei), dt(r.dst)]
    else:
        dts = [dt(r.src), dt(r.dst)]
    present = [d for d in dts if d]
    if not present:
        return None
    if len(set(present)) == 1:
        return present[0]
    return "".join(present)


def _numel(dims: tuple[int | None, ...] | None) -> float | None:
    if dims is None or any(d is None for d in dims):
        return None
    return float(math.prod(dims))  # type: ignore[arg-type]


def _size(dims: tuple[int | None, ...] | None, md: MemoryDesc | None, default_item: float = 4.0) -> float | None:
    n = _numel(dims)
    if n is None:
        return None
    return n * (md.itemsize if md is not None else default_item)


def flops(problem: Problem | None) -> tuple[float | None, float | None]:
    """(benchdnn flops, dense flops) for one problem."""
    if problem is None:
        return None, None
    d, f = problem.driver, problem.fields
    if d in CONV_DRIVERS:
        return conv_flops(problem), conv_flops_dense(problem)
    if d == "ip":
        val = 2.0 * f["m"] * f["n"] * f["k"]  # type: ignore[operator]
        return val, val
    if d == "matmul":
        if any(f.get(x) is None for x in ("m", "n", "k", "batch")):
            return None, None
        val = 2.0 * f["batch"] * f["m"] * f["n"] * f["k"]  # type: ignore[operator]
        return val, val
    return None, None


def _sum(values: list[float | None]) -> float | None:
    if any(v is None for v in values):
        return None
    return float(sum(values))  # type: ignore[arg-type]


def _gemm_traffic(d: str, t: tuple, direction: str, r: Roles, post_ops: str | None) -> float | None:
    """conv / deconv / ip / matmul: src, weights, dst (and bias), by direction."""
    src_t, wei_t, dst_t = t[0], t[1], t[-1]
    bia_t = t[2] if d != "matmul" and len(t) > 3 else ((dst_t[-1],) if dst_t else None)
    src, wei, dst = _size(src_t, r.src), _size(wei_t, r.wei), _size(dst_t, r.dst)
    bia = _size(bia_t, r.bia) if r.bia is not None else 0.0
    if direction.startswith("FWD") or d == "matmul":
        reads_dst = any(op.startswith("sum") for op in (post_ops or "").split("+"))
        return _sum([src, wei, dst, bia, dst if reads_dst else 0.0])
    if direction == "BWD_D":
        return _sum([dst, wei, src])
    if direction in ("BWD_W", "BWD_WB"):
        return _sum([src, dst, wei, bia if direction == "BWD_WB" else 0.0])
    return _sum([src, wei, dst, bia])


def _reorder_traffic(t: tuple, r: Roles) -> float | None:
    n = _numel(t[0])
    if n is None:
        return None
    return n * ((r.src.itemsize if r.src else 4.0) + (r.dst.itemsize if r.dst else 4.0))


def _binary_traffic(d: str, t: tuple, fwd: bool, r: Roles) -> float | None:
    """binary / prelu: two inputs (broadcast to the larger shape) and the output."""
    in_mds = (r.srcs + (r.src, r.src))[:2] if d == "binary" else (r.src, r.wei)
    ins = [_size(dims, md) for dims, md in zip(t[:2], in_mds)]
    if len(t) >= 2 and len(t[0]) == len(t[1]):
        out_dims = tuple(None if (a is None or b is None) else max(a, b) for a, b in zip(t[0], t[1]))
    else:
        out_dims = t[0]
    out = _size(out_dims, r.dst)
    if d == "prelu" and not fwd:  # reads src, wei, diff_dst; writes diff_src, diff_wei
        return _sum([*ins, out, *ins])
    return _sum([*ins, out])


def _concat_traffic(t: tuple, r: Roles) -> float | None:
    counts = [_numel(dims) for dims in t]
    if any(c is None for c in counts):
        return None
    srcs = r.srcs or ((r.src,) if r.src else ())
    items = [md.itemsize for md in srcs] + [4.0] * (len(t) - len(srcs))
    total_in = sum(c * it for c, it in zip(counts, items))  # type: ignore[operator]
    return total_in + sum(counts) * (r.dst.itemsize if r.dst else 4.0)  # type: ignore[arg-type]


def _sum_traffic(t: tuple, r: Roles) -> float | None:
    n = _numel(t[0])
    if n is None:
        return None
    srcs = r.srcs or ((r.src,) if r.src else ())
    return n * sum(md.itemsize for md in srcs) + n * (r.dst.itemsize if r.dst else 4.0)


def _pool_traffic(t: tuple, r: Roles, mds: tuple[MemoryDesc, ...]) -> float | None:
    """pool / resampling: src, dst and the workspace (max pooling's indices)."""
    src, dst = _size(t[0], r.src), _size(t[1] if len(t) > 1 else t[0], r.dst)
    ws = 0.0
    ws_md = next((md for md in mds if md.arg == "ws" and md.defined), None)
    if ws_md is not None and dst is not None:
        ws = _numel(t[1] if len(t) > 1 else t[0]) * ws_md.itemsize  # type: ignore[operator]
    return _sum([src, dst, ws])


def _single_tensor_traffic(problem: Problem, t: tuple, fwd: bool, r: Roles, aux: dict[str, str]) -> float | None:
    """eltwise, softmax, lnorm, bnorm, gnorm, lrn, shuffle, reduction ...: src, dst, statistics."""
    d = problem.driver
    src = _size(t[0], r.src)
    dst = _size(t[-1] if d == "reduction" and len(t) > 1 else t[0], r.dst)
    if src is None or dst is None:
        return None
    stats = 0.0
    if d in ("bnorm", "gnorm", "lnorm"):
        channels = float(problem.fields.get("ic") or (t[0][-1] if d == "lnorm" else 0) or 0)
        flags = aux.get("flags", "")
        vectors = 2.0 + ("C" in flags or "S" in flags) + ("H" in flags or "S" in flags)
        stats = vectors * channels * 4.0
    if fwd:
        return src + dst + stats
    return src + dst + dst + stats  # diff_dst and src (or dst) read, diff_src written


def traffic_bytes(
    problem: Problem | None,
    direction: str | None,
    r: Roles,
    mds: tuple[MemoryDesc, ...],
    post_ops: str | None,
    aux: dict[str, str],
) -> float | None:
    """Compulsory bytes read + written by one execution (None when dims are unknown)."""
    if problem is None or not problem.tensors or problem.driver == "rnn":
        return None  # RNN weights and states are not spelled out by the descriptor
    d, t = problem.driver, problem.tensors
    direction = direction or "FWD_D"
    fwd = direction.startswith("FWD")
    if d in GEMM_DRIVERS:
        return _gemm_traffic(d, t, direction, r, post_ops)
    if d == "reorder":
        return _reorder_traffic(t, r)
    if d in ("binary", "prelu"):
        return _binary_traffic(d, t, fwd, r)
    if d == "concat":
        return _concat_traffic(t, r)
    if d == "sum":
        return _sum_traffic(t, r)
    if d in ("pool", "resampling"):
        return _pool_traffic(t, r, mds)
    return _single_tensor_traffic(problem, t, fwd, r, aux)

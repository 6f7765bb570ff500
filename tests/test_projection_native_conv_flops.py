"""Model FLOPs of convolutions that ran in native ATen kernels count towards MFU."""

from __future__ import annotations

import polars as pl
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from profilednn.hardware.dtypes import conv_case_flops, native_conv_flops_by_dtype


def _case(direction: str, mb=2, ic=8, oc=16, hw=(10, 10), k=(3, 3), s=(2, 2), p=(1, 1), g=1) -> dict:
    out = [(i + 2 * pp - kk) // ss + 1 for i, kk, ss, pp in zip(hw, k, s, p)]
    return {"kind": "conv", "direction": direction, "mb": mb, "g": g, "ic": ic, "oc": oc, "in": list(hw),
            "out": out, "k": list(k), "s": list(s), "p": list(p), "dtype": "f32"}


def _counted(mb=2, ic=8, oc=16, hw=(10, 10), k=(3, 3), s=(2, 2), p=(1, 1), g=1, input_grad=True):
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(ic, oc, k, stride=s, padding=p, groups=g, bias=False)
    x = torch.randn(mb, ic, *hw, requires_grad=input_grad)
    with FlopCounterMode(display=False) as fwd:
        y = conv(x)
    with FlopCounterMode(display=False) as bwd:
        y.sum().backward()
    return fwd.get_total_flops(), bwd.get_total_flops()


@pytest.mark.parametrize("geometry", [{}, {"k": (1, 1), "s": (1, 1), "p": (0, 0)}, {"hw": (9, 7), "s": (1, 2)}])
def test_conv_case_flops_match_torch_flop_counter(geometry):
    fwd, bwd = _counted(**geometry)
    assert conv_case_flops(_case("FWD_D", **geometry)) == fwd
    assert conv_case_flops(_case("BWD_DW", **geometry)) == bwd


def test_grouped_conv_counts_each_group_once():
    # torch's counter agrees forward; its grouped backward formula ignores groups, ours is 2x forward
    fwd, _ = _counted(ic=8, oc=8, g=4, hw=(9, 7))
    case = _case("FWD_D", ic=8, oc=8, g=4, hw=(9, 7))
    assert conv_case_flops(case) == fwd
    assert conv_case_flops({**case, "direction": "BWD_DW"}) == 2 * fwd


def test_weight_only_backward_counts_one_gradient():
    fwd, bwd = _counted(input_grad=False)
    assert conv_case_flops(_case("BWD_W")) == bwd == fwd


def test_only_native_calls_count_per_step_and_dtype():
    cases = [{**_case("FWD_D"), "id": "c0"}, {**_case("BWD_DW"), "id": "c1"},
             {**_case("FWD_D"), "dtype": "bf16", "id": "c2"}]
    calls = pl.DataFrame({"case_id": ["c0", "c1", "c2"], "calls": [4, 4, 2],
                          "in_situ_path": ["aten::_slow_conv2d_forward", "oneDNN", "aten::_slow_conv2d_forward"]})
    per = native_conv_flops_by_dtype(cases, calls, steps=2)
    one = conv_case_flops(cases[0])
    assert per == {"fp32": 2 * one, "bf16": one}
    assert native_conv_flops_by_dtype(cases, calls.filter(pl.col("case_id") == "c1"), steps=2) == {}

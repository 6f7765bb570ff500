"""Problem descriptors: benchdnn's defaults, encode/decode round trips (hypothesis),
operation counts and memory traffic against hand-computed values."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from profilednn.verbose import CONV_FIELDS, ProblemError, decode_problem, encode_problem
from profilednn.verbose.mds import parse_mds, roles
from profilednn.verbose.metrics import flops, traffic_bytes
from profilednn.verbose.problem import conv_flops


def fields(driver: str, text: str) -> dict:
    return dict(decode_problem(driver, text).fields)


# -- benchdnn's implicit rules ---------------------------------------------------------
def test_omitted_fields_take_benchdnns_defaults():
    f = fields("conv", "ic16ih7oc16oh7kh5ph2")
    assert (f["mb"], f["g"], f["iw"], f["ow"], f["kw"], f["pw"]) == (2, 1, 7, 7, 5, 2)  # square
    assert (f["sh"], f["sw"], f["dh"], f["dw"]) == (1, 1, 0, 0)
    assert (f["id"], f["od"], f["kd"], f["sd"], f["dd"], f["pd"], f["pd_r"]) == (1, 1, 1, 1, 0, 0, 0)


def test_output_and_padding_are_deduced():
    assert fields("conv", "mb1ic3ih227oc96kh11sh4")["oh"] == 55  # output from input, kernel, stride
    assert fields("conv", "mb1ic8ih32oc8oh16kh3sh2")["ph"] == 0  # padding from sizes: ((15*2)-32+3)//2
    assert fields("conv", "mb1ic8ih32oc8oh32kh3")["ph"] == 1
    assert fields("deconv", "mb1ic8ih16oc8kh4sh2ph1")["oh"] == 32  # (16-1)*2 + 4 - 2


def test_right_padding_follows_benchdnn():
    f = fields("conv", "mb2_ic4oc8_iw20ow10kw5sw2dw0pw2")  # 1D
    assert (f["pw"], f["pw_r"], f["ih"], f["kh"]) == (2, 1, 1, 1)
    d = fields("deconv", "mb2_ic4oc6_ih5oh10kh3sh2dh0ph1_iw5ow10kw3sw2dw0pw1")  # output_padding=1
    assert (d["ph"], d["ph_r"]) == (1, 0)
    assert fields("conv", "mb1ic4ih8oc4oh4kh3sh2ph1")["ph_r"] == 0


def test_cubic_shapes_propagate_from_d():
    f = fields("conv", "mb1ic2id6oc4od6kd3pd1")
    assert (f["ih"], f["iw"], f["oh"], f["kw"], f["ph"], f["pw_r"]) == (6, 6, 6, 3, 1, 1)


@pytest.mark.parametrize("bad", ["", "mb2ic0oc8ih8kh3", "mb2ic3oc8", "mb2ic3oc8ih8kh3sh0", "g3mb2ic4oc6ih8kh3",
                                 "mb2ic3oc8ih8kh3xx", "mb2ic3oc8id4ih8kh3kd2"])
def test_invalid_descriptors_raise(bad: str):
    with pytest.raises(ProblemError):
        decode_problem("conv", bad)


def test_matmul_forms_batches_broadcast_and_runtime_dims():
    assert fields("matmul", "2x16:16x8") == {"m": 2, "n": 8, "k": 16, "batch": 1}
    assert fields("matmul", "3x1x8x16:1x4x16x32")["batch"] == 12  # broadcast batch dims
    assert fields("matmul", "3x8x16:3x16x4:3x8x4") == {"m": 8, "n": 4, "k": 16, "batch": 3}
    assert fields("matmul", "*x16:16x8")["m"] is None
    with pytest.raises(ProblemError, match="differ"):
        decode_problem("matmul", "2x16:15x8")


def test_dims_problems_keep_every_tensor():
    p = decode_problem("binary", "32x12x128x128:32x1x1x128")
    assert p.dims == "32x12x128x128" and p.tensors[1] == (32, 1, 1, 128)
    assert decode_problem("concat", "2x3:2x5").tensors == ((2, 3), (2, 5))
    assert decode_problem("reorder", "8").dims == "8"


# -- round trips ------------------------------------------------------------------------
@st.composite
def conv_problems(draw, deconv: bool = False):
    nd = draw(st.integers(3, 5))
    g = draw(st.integers(1, 4))
    ic, oc = g * draw(st.integers(1, 8)), g * draw(st.integers(1, 8))
    f = {"mb": draw(st.integers(1, 64)), "g": g, "ic": ic, "oc": oc}
    for a, active in zip("dhw", (nd == 5, nd >= 4, True)):
        if not active:
            f.update({f"i{a}": 1, f"o{a}": 1, f"k{a}": 1, f"s{a}": 1, f"d{a}": 0, f"p{a}": 0})
            continue
        k, s, d = draw(st.integers(1, 7)), draw(st.integers(1, 3)), draw(st.integers(0, 2))
        p = draw(st.integers(0, k - 1))
        ext = (k - 1) * (d + 1) + 1
        if deconv:
            i = draw(st.integers(1, 24))
            o = (i - 1) * s + ext - 2 * p
            if o < 1:
                o, p = (i - 1) * s + ext, 0
        else:
            i = draw(st.integers(max(1, ext - 2 * p), ext + 24))
            o = (i - ext + 2 * p) // s + 1
        f.update({f"i{a}": i, f"o{a}": o, f"k{a}": k, f"s{a}": s, f"d{a}": d, f"p{a}": p})
    return nd, f


@settings(max_examples=200, deadline=None)
@given(conv_problems())
def test_conv_encode_then_decode_gives_the_same_fields(case):
    nd, f = case
    text = encode_problem("conv", f, nd)
    back = fields("conv", text)
    assert {k: back[k] for k in f} == f
    assert set(back) == set(CONV_FIELDS)
    assert encode_problem("conv", back, decode_problem("conv", text).ndims) == text


@settings(max_examples=100, deadline=None)
@given(conv_problems(deconv=True))
def test_deconv_round_trip(case):
    nd, f = case
    back = fields("deconv", encode_problem("deconv", f, nd))
    assert {k: back[k] for k in f} == f


@settings(max_examples=100, deadline=None)
@given(conv_problems())
def test_pool_round_trip(case):
    nd, f = case
    f = {k: v for k, v in f.items() if k not in ("g", "oc")}
    back = fields("pool", encode_problem("pool", f, nd))
    assert {k: back[k] for k in f} == f


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 512), st.integers(1, 512), st.integers(1, 512), st.sampled_from([(), (5,), (3, 3), (2, 4, 4)]))
def test_ip_round_trip(mb, ic, oc, spatial):
    f = {"mb": mb, "ic": ic, "oc": oc}
    f.update({f"i{a}": v for a, v in zip("dhw"[3 - len(spatial):], spatial)})
    back = fields("ip", encode_problem("ip", f))
    assert {k: back[k] for k in f} == f
    assert back["k"] == ic * math.prod(spatial)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 4096), st.integers(1, 4096), st.integers(1, 4096), st.integers(1, 64))
def test_matmul_round_trip(m, n, k, batch):
    f = {"m": m, "n": n, "k": k, "batch": batch}
    assert fields("matmul", encode_problem("matmul", f)) == f


@settings(max_examples=100, deadline=None)
@given(conv_problems())
def test_benchdnn_flops_never_exceed_dense_and_match_a_direct_count(case):
    nd, f = case
    p = decode_problem("conv", encode_problem("conv", f, nd))
    fl, dense = flops(p)
    assert 0 <= fl <= dense  # 0 when every tap of a tiny input lands in padding
    taps = 1
    for a in "dhw":  # brute force over every output position and kernel tap
        count = 0
        for o in range(f[f"o{a}"]):
            for kk in range(f[f"k{a}"]):
                pos = o * f[f"s{a}"] - f[f"p{a}"] + kk * (f[f"d{a}"] + 1)
                count += 0 <= pos < f[f"i{a}"]
        taps *= count
    assert fl == 2 * f["mb"] * f["oc"] * f["ic"] // f["g"] * taps


# -- hand-computed operation counts and traffic ----------------------------------------
def test_conv_flops_exclude_padding_taps():
    p = decode_problem("conv", "mb1_ic1oc1_ih3oh3kh3sh1dh0ph1_iw3ow3kw3sw1dw0pw1")
    # 3x3 input, 3x3 kernel, pad 1: per dim the taps inside are 2+3+2 = 7 -> 49 MACs
    assert conv_flops(p) == 2 * 49
    assert flops(p) == (98.0, 2 * 81.0)


def test_deconv_and_matmul_and_ip_flops():
    d = decode_problem("deconv", "mb1_ic2oc3_ih2oh4kh2sh2dh0ph0_iw2ow4kw2sw2dw0pw0")
    assert flops(d) == (2.0 * 3 * 2 * 16, 2.0 * 3 * 2 * 16)  # every input pixel meets every tap
    assert flops(decode_problem("matmul", "4x8x16:4x16x32")) == (2.0 * 4 * 8 * 16 * 32,) * 2
    assert flops(decode_problem("ip", "mb8ic3ih4iw4oc10"))[0] == 2.0 * 8 * 10 * 3 * 16
    assert flops(decode_problem("eltwise", "2x3x4x4")) == (None, None)


CONV_MDS = "src:f32::blocked:abcd::f0 wei:f32::blocked:abcd::f0 bia:f32::blocked:a::f0 dst:f32::blocked:abcd::f0"


@pytest.mark.parametrize(
    ("direction", "expected_elems"),
    [
        ("FWD_B", 2 * 3 * 8 * 8 + 4 * 3 * 9 + 4 + 2 * 4 * 8 * 8),
        ("BWD_D", 2 * 4 * 8 * 8 + 4 * 3 * 9 + 2 * 3 * 8 * 8),
        ("BWD_W", 2 * 3 * 8 * 8 + 2 * 4 * 8 * 8 + 4 * 3 * 9),
        ("BWD_WB", 2 * 3 * 8 * 8 + 2 * 4 * 8 * 8 + 4 * 3 * 9 + 4),
    ],
)
def test_conv_bytes_depend_on_direction(direction: str, expected_elems: int):
    p = decode_problem("conv", "mb2_ic3oc4_ih8oh8kh3sh1dh0ph1_iw8ow8kw3sw1dw0pw1")
    mds = parse_mds(CONV_MDS)
    assert traffic_bytes(p, direction, roles(mds), mds, None, {}) == 4 * expected_elems


def test_bytes_use_each_tensors_data_type():
    p = decode_problem("conv", "mb1_ic4oc4_ih2oh2kh1sh1dh0ph0_iw2ow2kw1sw1dw0pw0")
    mds = parse_mds("src_u8::blocked:acdb::f0 wei_s8::blocked:abcd::f0 bia_undef::undef::: dst_f32::blocked:acdb::f0")
    assert traffic_bytes(p, "FWD_I", roles(mds), mds, None, {}) == 16 * 1 + 16 * 1 + 16 * 4
    reorder = decode_problem("reorder", "4x4")
    r_mds = parse_mds("src:f32::blocked:ab::f0 dst:bf16::blocked:ba::f0")
    assert traffic_bytes(reorder, None, roles(r_mds), r_mds, None, {}) == 16 * (4 + 2)

"""One vocabulary (``profilednn.vocabulary``): every job draws the same lines, and the
places whose copies used to differ now agree (addbmm is a GEMM everywhere, NNPACK is a
native convolution for the advice too, the elementwise ops are one set)."""

from __future__ import annotations

import json
import subprocess
import sys

import polars as pl
import pytest

from profilednn.analysis import Analysis, advise
from profilednn.analysis.taxonomy import is_elementwise_op
from profilednn.hardware.roofline import op_flops_bytes
from profilednn.optimization.op_families import event_family
from profilednn.tables import OPS
from profilednn.vocabulary import (
    COPY_FILL_OPS, DTYPE_NAMES, ELEMENTWISE_OPS, GEMM_KERNEL_PATTERN, NATIVE_CONV_PATTERN, ONEDNN_DTYPE,
    PROFILER_DTYPE, PROFILER_TENSOR_TYPES, TORCH_DTYPE, cfg_dtype, dtype_name, is_native_conv, op_dtype, op_family,
)

from runfactory import make_run


def test_the_vocabulary_imports_no_heavy_library() -> None:
    code = ("import json, sys, profilednn.vocabulary; "
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'polars', 'numpy'})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_addbmm_is_a_gemm_for_the_replay_the_family_split_and_the_precision_advice() -> None:
    assert op_family("aten::addbmm") == "gemm"
    assert event_family("aten::addbmm") == "gemm"  # the family split called it "other" before
    assert pl.Series(["aten::addbmm"]).str.contains(GEMM_KERNEL_PATTERN).item()
    # addbmm(input, batch1, batch2): 2*b*n*m*p FLOPs, counted with the GEMM model
    flops, _ = op_flops_bytes("aten::addbmm", [[4, 6], [3, 4, 5], [3, 5, 6]], ["float"] * 3)
    assert flops == 2.0 * 3 * 4 * 5 * 6


@pytest.mark.parametrize("op", ["aten::_slow_conv2d_forward", "aten::thnn_conv2d", "aten::slow_conv_dilated2d",
                                "aten::_nnpack_spatial_convolution"])
def test_native_convolutions_are_one_list(op: str) -> None:
    assert is_native_conv(op)
    assert pl.Series([op]).str.contains(NATIVE_CONV_PATTERN).item()
    assert pl.Series([op]).str.contains(GEMM_KERNEL_PATTERN).item()


@pytest.mark.parametrize("op", ["aten::mkldnn_convolution", "aten::convolution", "aten::conv2d", "aten::linear"])
def test_onednn_and_composite_convolutions_are_not_native_kernels(op: str) -> None:
    assert not is_native_conv(op)
    assert not pl.Series([op]).str.contains(GEMM_KERNEL_PATTERN).item()


def test_the_advice_sees_nnpack_convolutions_as_a_fallback(tmp_path) -> None:
    run = make_run(tmp_path, threads=1, native_conv=("layer1.0.conv1", "layer1.0.conv2"))
    ops = run.table(OPS)
    nnpack = pl.col("op").str.replace(r"^aten::(_slow_conv2d_\w+|thnn_conv2d)$", "aten::_nnpack_spatial_convolution")
    run.write_table(OPS, ops.with_columns(nnpack.alias("op")))
    assert "aten::_nnpack_spatial_convolution" in run.table(OPS)["op"].to_list()
    assert "native_conv_fallback" in [a.rule for a in advise(Analysis(run.path))]


def test_elementwise_ops_are_one_set_for_the_analysis_and_the_replay() -> None:
    # each side used to miss some of the other's: the analysis the activations' backward,
    # the replay the rounding, comparison and logical ops
    for name in ("gelu_backward", "leaky_relu_", "erf", "eq", "logical_not", "add_"):
        assert name in ELEMENTWISE_OPS
        assert op_family(f"aten::{name}") == "elementwise"
    flagged = pl.DataFrame({"op": ["aten::gelu_backward", "aten::copy_", "aten::mm", "torch::add"]}).select(
        is_elementwise_op(pl.col("op")))["op"].to_list()
    assert flagged == [True, False, False, False]  # copies are replayed as elementwise, not counted as compute
    assert all(op_family(f"aten::{name}") == "elementwise" for name in COPY_FILL_OPS)
    assert op_family("aten::binary_cross_entropy_with_logits") == "loss"


@pytest.mark.parametrize("name", DTYPE_NAMES)
def test_every_spelling_of_a_dtype_names_it(name: str) -> None:
    assert dtype_name(name.upper()) == name
    assert dtype_name(TORCH_DTYPE[name]) == name
    assert dtype_name(ONEDNN_DTYPE[name]) == name
    assert cfg_dtype(ONEDNN_DTYPE[name]) == name
    assert op_dtype(["", PROFILER_DTYPE[name], "float"]) == name  # the first tensor's type
    assert PROFILER_TENSOR_TYPES[PROFILER_DTYPE[name]] == TORCH_DTYPE[name]


def test_unknown_spellings_fall_back_or_say_so() -> None:
    assert dtype_name("int8") is None
    assert cfg_dtype(None) == cfg_dtype("s8") == "fp32"
    assert op_dtype([]) == op_dtype(["long int"]) == "fp32"

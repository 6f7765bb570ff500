"""Roofline math on hand-computed cases; what-if scaling laws on constructed Runs."""

from __future__ import annotations

import polars as pl
import pytest
from runfactory import make_run

from profilednn.errors import InputError
from profilednn.projection import MachineProfile, Measurement, project, whatif
from profilednn.hardware.roofline import (
    add_roofline, arithmetic_intensity, attainable_ms, bound, op_flops_bytes,
)


def _machine(name: str, peak: float, bw: float, cores: int = 2, bf16: float | None = None) -> MachineProfile:
    gemm = {"fp32": {cores: Measurement.of([peak]), 1: Measurement.of([peak / cores])}}
    if bf16:
        gemm["bf16"] = {cores: Measurement.of([bf16])}
    return MachineProfile(name=name, cpu_model=name, cores=cores, gemm=gemm,
                          native_dtypes=tuple(gemm), bandwidth={cores: Measurement.of([bw])})


# ------------------------------------------------------------------ roofline
def test_roofline_hand_computed() -> None:
    # 2 GFLOP at 100 GFLOP/s = 20 ms; 1 GB at 10 GB/s = 100 ms -> memory bound, 100 ms
    assert attainable_ms(2e9, 1e9, 100.0, 10.0) == pytest.approx(100.0)
    assert bound(2e9, 1e9, 100.0, 10.0) == "memory"
    assert arithmetic_intensity(2e9, 1e9) == 2.0
    # above the ridge point (100/10 = 10 FLOP/byte): compute bound
    assert attainable_ms(4e9, 1e8, 100.0, 10.0) == pytest.approx(40.0)
    assert bound(4e9, 1e8, 100.0, 10.0) == "compute"


def test_gemm_op_flops_and_bytes() -> None:
    f, b = op_flops_bytes("aten::mm", [[64, 32], [32, 16]], ["float", "float"])
    assert f == 2 * 64 * 16 * 32
    assert b == (64 * 32 + 32 * 16 + 64 * 16) * 4
    f, b = op_flops_bytes("aten::addmm", [[16], [64, 32], [32, 16], [], []],
                          ["float", "float", "float", "Scalar", "Scalar"])
    assert f == 2 * 64 * 16 * 32
    f, b = op_flops_bytes("aten::add_", [[10, 10], [10, 10], []], ["float", "float", "Scalar"])
    assert (f, b) == (100, 800)  # in place: two reads, nothing extra written


def test_add_roofline_uses_the_dtype_peak_and_fp32_for_emulated_bf16() -> None:
    m = _machine("m", 100.0, 10.0)
    df = pl.DataFrame({"flops": [4e9, 4e9], "bytes": [1e8, 1e8], "dtype": ["fp32", "bf16"]})
    out = add_roofline(df, m, None)
    assert out["attainable_ms"].to_list() == pytest.approx([40.0, 40.0])
    assert out["bound"].to_list() == ["compute", "compute"]


# ------------------------------------------------------------------ what-if laws
@pytest.fixture(scope="module")
def proj(tmp_path_factory):
    run = make_run(tmp_path_factory.mktemp("runs"))
    return project(run, machine=_machine("here", 100.0, 10.0), replay=False, write=False)


def test_projection_without_replay_equals_in_situ(proj) -> None:
    s = proj.summary
    assert s["projected_kernel_ms"] == pytest.approx(s["in_situ_kernel_ms"])
    assert s["efficiency"] == pytest.approx(s["projected_kernel_ms"] / s["measured_step_ms"])
    for key in ("measured_step_ms", "projected_kernel_ms", "efficiency", "mfu"):
        assert key in s
    for col in ("in_situ_ms", "replay_ms", "flops", "bytes", "attainable_ms"):
        assert col in proj.primitives.columns
    by = proj.by_driver
    assert by["in_situ_ms"].sum() == pytest.approx(s["in_situ_kernel_ms"])


def test_same_machine_same_threads_is_identity(proj) -> None:
    here = _machine("here", 100.0, 10.0)
    w = whatif(proj, source=here)
    assert w.summary["whatif_step_ms"] == pytest.approx(proj.summary["measured_step_ms"])


def test_twice_the_peaks_halves_the_kernels(proj) -> None:
    here, there = _machine("here", 100.0, 10.0), _machine("there", 200.0, 20.0)
    w = whatif(proj, machine=there, source=here)
    s, items = w.summary, w.items
    unbounded = float(items.filter(pl.col("bound").is_null())["in_situ_ms"].sum())  # no FLOPs, no bytes
    assert unbounded < 0.2 * s["in_situ_kernel_ms"]
    expected = unbounded + (s["in_situ_kernel_ms"] - unbounded) / 2
    assert s["whatif_kernel_ms"] == pytest.approx(expected)
    assert s["whatif_step_ms"] == pytest.approx(s["framework_ms"] + expected)


def test_driver_speedup_follows_amdahl(proj) -> None:
    here = _machine("here", 100.0, 10.0)
    conv = float(proj.primitives.filter(pl.col("driver") == "conv")["in_situ_total_ms"].sum())
    w = whatif(proj, driver_speedup=["conv=4"], source=here)
    assert w.summary["whatif_step_ms"] == pytest.approx(
        proj.summary["measured_step_ms"] - conv + conv / 4)
    with pytest.raises(InputError, match="not in this projection"):
        whatif(proj, driver_speedup={"rnn": 2.0}, source=here)
    with pytest.raises(InputError, match="DRIVER=K"):
        whatif(proj, driver_speedup=["conv"], source=here)


def test_fewer_threads_scale_compute_with_the_peak(proj) -> None:
    here = _machine("here", 100.0, 10.0)
    w = whatif(proj, threads=1, source=here)
    items = w.items
    compute = items.filter(pl.col("bound") == "compute")
    assert (compute["factor"] - 2.0).abs().max() < 1e-9  # peak 100 at 2 threads, 50 at 1
    memory = items.filter(pl.col("bound") == "memory")
    # bandwidth measured only at 2 threads: one thread is assumed to get half of it
    assert memory.height and (memory["factor"] - 2.0).abs().max() < 1e-9


def test_bf16_needs_a_native_target(proj) -> None:
    here = _machine("here", 100.0, 10.0)
    with pytest.raises(InputError, match="no native bf16"):
        whatif(proj, dtype="bf16", source=here)
    there = _machine("amx box", 100.0, 10.0, bf16=400.0)
    w = whatif(proj, machine=there, dtype="bf16", source=here)
    conv = w.items.filter((pl.col("driver") == "conv") & (pl.col("bound") == "compute"))
    assert conv.height and (conv["factor"] - 0.25).abs().max() < 1e-9
    other = w.items.filter(pl.col("driver").str.starts_with("aten:norm") & (pl.col("bound") == "memory"))
    assert other.is_empty() or (other["factor"] - 1.0).abs().max() < 1e-9
    assert any("BF16" in a for a in w.assumptions)

"""The cache a cold replay evicts: the cache the Run could use, measured where it can be,
never the host's whole cache that a guest's sysfs reports (a 2-core slice of a Xeon
reported 480 MiB; evicting twice that over-predicted its own step by 39%)."""

from __future__ import annotations

import pytest

from profilednn.hardware import machine as machine_mod
from profilednn.hardware.machine import MachineProfile, Measurement, cache_knee
from profilednn.projection.replay import run_worker
from profilednn.projection.replay_cache import DEFAULT_CACHE, PER_CORE_CAP, replay_cache
from profilednn.topology import Cache, CpuTopology, Core, cpu_topology

MIB = 2**20

# (MiB, GB/s) as the sweep saw them on the 2-core Xeon guest: L2 to 4 MiB, its share of the
# L3 to ~69 MiB, then memory
XEON_GUEST = [(1, 168), (2, 194), (3, 197), (4, 181), (5, 148), (7, 111), (9, 109), (15, 107), (28, 110),
              (44, 110), (55, 109), (69, 103), (87, 87), (108, 57), (135, 41), (211, 39), (516, 40)]
# a 32 MiB L3 behind 512 KiB L2s
SMALL_L3 = [(1, 150), (2, 120), (4, 118), (8, 117), (16, 115), (24, 112), (32, 95), (48, 40), (64, 30),
            (128, 29)]


def _topology(llc_mib: int | None) -> CpuTopology:
    caches = ((Cache(2, "Unified", 2 * MIB, 1), Cache(3, "Unified", llc_mib * MIB, 2)) if llc_mib else ())
    return CpuTopology("test cpu", (Core(0, 0, 0, (0,)), Core(0, 1, 0, (1,))), frozenset({"avx2"}), caches)


def _machine(cache_bytes: int | None, source: str = "measured") -> MachineProfile:
    return MachineProfile(name="box", cpu_model="box", cores=2, gemm={"fp32": {2: Measurement.of([100.0])}},
                          bandwidth={2: Measurement.of([20.0])}, source=source, cache_bytes=cache_bytes)


def test_the_capacity_is_where_bandwidth_falls_halfway_to_memory() -> None:
    # plateau 110, floor 39: 74.5 GB/s crossed between 87 and 108 MiB, log-interpolated
    assert cache_knee([(m, float(g)) for m, g in XEON_GUEST], private_bytes=4 * MIB) == pytest.approx(
        87 * (108 / 87) ** ((87 - 74.5) / 30) * MIB, rel=1e-6)
    assert cache_knee([(m, float(g)) for m, g in SMALL_L3], private_bytes=1 * MIB) == pytest.approx(37.2 * MIB,
                                                                                                    rel=0.01)
    flat = [(m, 100.0) for m in (1, 2, 4, 8, 16, 32)]
    assert cache_knee(flat) is None  # never fell: the cache is larger than the sweep


def test_measured_cache_is_what_a_cold_replay_evicts() -> None:
    cold = replay_cache(_machine(95 * MIB), _topology(480), threads=2)
    assert (cold.bytes, cold.source) == (95 * MIB, "measured")
    assert "480 MiB" in cold.detail and "95 MiB" in cold.detail


def test_a_step_that_fits_in_the_cache_is_replayed_with_its_data_cached() -> None:
    fits = replay_cache(_machine(95 * MIB), _topology(480), threads=2, footprint=30 * MIB)
    assert fits.bytes == 30 * MIB and fits.source == "measured, bounded by the step's footprint"
    assert replay_cache(_machine(95 * MIB), _topology(480), 2, footprint=368 * MIB).bytes == 95 * MIB


def test_without_a_measurement_a_hosts_cache_is_capped_per_thread() -> None:
    capped = replay_cache(None, _topology(480), threads=2)
    assert (capped.bytes, capped.source) == (2 * PER_CORE_CAP, "sysfs, capped per core")
    assert replay_cache(_machine(69 * MIB, source="file"), _topology(480), 1).bytes == PER_CORE_CAP
    small = replay_cache(None, _topology(32), threads=2)
    assert (small.bytes, small.source) == (32 * MIB, "sysfs")
    assert replay_cache(None, _topology(None), 2).bytes == DEFAULT_CACHE


@pytest.mark.cpu_facing
def test_cold_replays_never_evict_more_than_the_run_could_use(cpu_profile) -> None:
    """On every CPU: what the machine profile measured, else at most the per-core cap; on
    the Xeon guest (480 MiB reported) the measured 97 MiB, not 2 x 480 MiB as before."""
    topo = cpu_topology()
    cold = replay_cache(machine_mod.cached_machine(), topo, threads=topo.physical_cores)
    assert cold.bytes <= (topo.llc_bytes or DEFAULT_CACHE)  # never twice the reported cache, as before
    if cold.source != "measured":
        assert cold.bytes <= topo.physical_cores * PER_CORE_CAP
    if cpu_profile == "intel-amx-2core":
        assert topo.llc_bytes == 480 * MIB
        assert (cold.source, cold.bytes) == ("measured", 101808702)


def test_machine_profile_keeps_its_cache_measurement(tmp_path) -> None:
    prof = _machine(95 * MIB)
    prof.cache_sweep = [(4.0, 181.0), (69.0, 103.0), (108.0, 57.0)]
    back = MachineProfile.from_toml(prof.save(tmp_path / "m.toml"))
    assert back.cache_bytes == 95 * MIB and back.cache_sweep == prof.cache_sweep
    legacy = tmp_path / "old.toml"
    legacy.write_text('name = "old"\ncores = 2\nbandwidth_gbs = 20.0\n[peak_gflops]\nfp32 = 100.0\n')
    assert MachineProfile.from_toml(legacy).cache_bytes is None


def test_the_worker_evicts_the_bytes_it_is_told() -> None:
    case = {"id": "m", "kind": "matmul", "a": [8, 8], "b": [8, 8], "dtype": "f32", "evict": True}
    result = run_worker([case], threads=1, budget_s=0.01, min_reps=2, max_reps=2, evict_bytes=3 * MIB)
    assert result.env["evict_bytes"] == 3 * MIB
    assert result.cases["m"]["evicted"] is True


def test_step_footprint_counts_the_forwards_compute_inputs() -> None:
    import polars as pl

    from profilednn.projection.replay_cache import step_footprint_bytes

    ops = pl.DataFrame({
        "op": ["aten::convolution", "aten::native_batch_norm", "aten::conv2d", "aten::add_"],
        "phase": ["forward", "forward", "forward", "optimizer"],
        "input_shapes": ["[[2, 4, 8, 8], [4, 4, 3, 3]]", "[[2, 4, 8, 8]]", "[[2, 4, 8, 8]]", "[[100]]"],
        "dtypes": ["['float', 'float']", "['c10::BFloat16']", "['float']", "['float']"],
        "calls": [2, 2, 2, 2],
    })
    # conv: 512 floats x 2 calls; batch norm: 512 bf16 x 2; conv2d is a wrapper, the optimizer not forward
    assert step_footprint_bytes(ops, steps=2) == (512 * 4 * 2 + 512 * 2 * 2) / 2
    assert step_footprint_bytes(pl.DataFrame(), 1) is None


def test_a_dtype_what_if_replays_conv_calls_and_gemm_ops_in_that_dtype() -> None:
    import polars as pl

    from profilednn.errors import InputError
    from profilednn.projection.projector import in_dtype

    convs = [{"id": "c0", "dtype": "f32"}, {"id": "c1", "dtype": "bf16"}]
    ops = [{"id": "o0", "dtypes": ["float", "float"]}, {"id": "o1", "dtypes": ["float"]}]
    uops = pl.DataFrame({"case_id": ["o0", "o1"], "family": ["gemm", "norm"]})
    in_dtype("bf16", convs, ops, uops)
    assert [c["dtype"] for c in convs] == ["bf16", "bf16"]
    assert ops[0]["dtypes"] == ["c10::BFloat16", "c10::BFloat16"] and ops[1]["dtypes"] == ["float"]
    with pytest.raises(InputError, match="bf16 or fp16"):
        in_dtype("int8", convs, ops, uops)


def test_a_replayed_what_if_takes_the_measured_parts() -> None:
    import polars as pl

    from profilednn.projection.what_if import _replayed_step_fields

    class P:  # what the function reads of a Projection
        def __init__(self, conv: float, native: float) -> None:
            self.step = pl.DataFrame({"phase": ["forward", "backward"], "part": ["conv calls", "native kernels"],
                                      "in_situ_ms": [conv, native], "projected_ms": [conv, native],
                                      "calls": [1.0, 1.0], "assumption": ["", ""]})
            self.summary = {"projected_step_ms": conv + native}

    fields = _replayed_step_fields(P(266.0, 83.0), P(149.0, 83.0))
    assert fields["projected_step_ms"] == 232.0
    assert fields["step_part_factors"]["conv calls"] == pytest.approx(149 / 266)
    assert fields["step_part_factors"]["native kernels"] == pytest.approx(1.0)

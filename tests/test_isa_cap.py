"""oneDNN's ISA cap (``ONEDNN_MAX_CPU_ISA``): the flags above it leave the topology every job
reasons about, the Run's fingerprint follows, and a machine profile measured without the cap
never answers for a process that runs with it."""

from __future__ import annotations

import pytest

from profilednn.capture.fingerprint import has_native_bf16, isa_flags
from profilednn.hardware.machine import MachineProfile, Measurement, kernel_env, machine_key
from profilednn.topology import capped_isa, cpu_topology, isa_cap_note, onednn_isa_cap

AMX_CPU = {"model_name": "Xeon with AMX", "physical_cores": 2,
           "isa": ["avx", "avx2", "fma", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                   "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "sse4_2"]}


def test_each_cap_keeps_the_flags_its_kernels_may_use() -> None:
    isa = frozenset(AMX_CPU["isa"])
    no_amx = capped_isa(isa, "AVX512_CORE_BF16")
    assert "avx512_bf16" in no_amx and not no_amx & {"amx_tile", "amx_bf16", "amx_int8", "avx512_fp16"}
    assert capped_isa(isa, "avx512_core_amx") == isa - {"amx_fp16"}
    assert capped_isa(isa, "AVX2") == {"avx", "avx2", "fma", "sse4_2"}
    # the levels are bit masks, not a ladder: AVX512_CORE lacks AVX2_VNNI's bit
    assert "avx_vnni" not in capped_isa(isa, "AVX512_CORE") and "avx512f" in capped_isa(isa, "AVX512_CORE")
    assert capped_isa(isa, "AVX2_VNNI") == {"avx", "avx2", "fma", "avx_vnni", "sse4_2"}


def test_the_cap_changes_what_every_job_sees(inject_cpu, monkeypatch) -> None:
    assert inject_cpu(topology=AMX_CPU).native_dtypes == ("fp32", "bf16", "fp16")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx512_core_bf16")
    topo = cpu_topology()
    assert topo.native_dtypes == ("fp32", "bf16") and "amx_bf16" not in topo.isa
    assert onednn_isa_cap() == ("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    note = isa_cap_note()
    assert note.startswith("ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 caps") and "amx_bf16" in note
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert cpu_topology().native_dtypes == ("fp32",)
    assert not has_native_bf16() and "avx512f" not in isa_flags()


def test_the_older_variable_and_values_onednn_ignores(inject_cpu, monkeypatch) -> None:
    inject_cpu(topology=AMX_CPU)
    monkeypatch.setenv("DNNL_MAX_CPU_ISA", "AVX2")
    assert cpu_topology().native_dtypes == ("fp32",)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "ALL")  # the newer name wins, and lifts the cap
    assert onednn_isa_cap() is None and "amx_bf16" in cpu_topology().isa and isa_cap_note() is None
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX9000")
    assert onednn_isa_cap() is None and "amx_bf16" in cpu_topology().isa
    assert "is not a oneDNN ISA level" in isa_cap_note() and "ignores it" in isa_cap_note()


def test_a_profile_measured_uncapped_does_not_answer_under_a_cap(monkeypatch) -> None:
    plain = machine_key()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    capped = machine_key()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    assert capped != plain and machine_key() == capped
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX2")  # MKL's fp32 GEMM cap changes the peak too
    assert machine_key() not in (plain, capped)
    assert kernel_env() == {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def test_the_profile_records_the_environment_it_was_measured_under() -> None:
    prof = MachineProfile(name="box", cpu_model="box", cores=2, gemm={"fp32": {2: Measurement.of([300.0])}},
                          bandwidth={2: Measurement.of([20.0])},
                          kernel_env={"ONEDNN_MAX_CPU_ISA": "AVX2"})
    back = MachineProfile.from_dict(prof.to_dict())
    assert back.kernel_env == {"ONEDNN_MAX_CPU_ISA": "AVX2"}
    prof.kernel_env = {}
    assert "kernel_env" not in prof.to_dict() and MachineProfile.from_dict(prof.to_dict()).kernel_env == {}


@pytest.mark.parametrize("value", ["", "default"])
def test_no_cap(monkeypatch, value: str) -> None:
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", value)
    assert onednn_isa_cap() is None and isa_cap_note() is None


def test_native_kernels_stay_within_atens_vector_isa(monkeypatch) -> None:
    from profilednn.kernels.build import isa_flags as build_flags
    from profilednn.topology import detected_topology

    silicon = build_flags(detected_topology())  # an explicit topology is never capped
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert not any(f.startswith("-mavx512") for f in build_flags())
    assert build_flags() == [f for f in silicon if not f.startswith("-mavx512")]
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    assert build_flags() == []
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx512")
    assert build_flags() == silicon and build_flags(detected_topology()) == silicon


def test_a_recipe_skipped_by_the_cap_says_the_cap_did_it(inject_cpu, monkeypatch) -> None:
    from profilednn.optimization.recipe_contract import Context

    inject_cpu(topology=AMX_CPU)
    assert Context(cpu_topology()).dtype_speed("bf16").faster  # AMX: a matrix unit
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    speed = Context(cpu_topology()).dtype_speed("bf16")
    assert not speed.faster and speed.basis == "emulated"
    assert "ONEDNN_MAX_CPU_ISA=AVX2 keeps oneDNN from this CPU's amx_bf16, avx512_bf16" in speed.reason
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    inject_cpu("-avx512_bf16,-amx_bf16")  # the silicon said no: no cap to name
    assert "ONEDNN_MAX_CPU_ISA" not in Context(cpu_topology()).dtype_speed("bf16").reason

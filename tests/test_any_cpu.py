"""Any CPU: an injected topology drives every ISA branch; per-dtype peaks, MFU and the
BF16 advice hold on CPUs with and without native BF16 (both covered here by injection);
cache facts, and "native means faster": a dtype is advised, projected or tried as a
speed-up only where it pays. Every test here also runs as each recorded CPU of tests/cpus."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from conftest import NATIVE_BF16_FLAGS, SUITE_FLAGS
from cpuprofiles import REAL
from runfactory import make_run

from profilednn import topology
from profilednn.analysis import Analysis, advise
from profilednn.analysis.precision_rules import ASSUMED_BF16_PEAK_RATIO, BF16_NATIVE_SHARE_MIN_PCT
from profilednn.capture.fingerprint import fingerprint
from profilednn.errors import InputError
from profilednn.projection import MachineProfile, Measurement, get_machine, project, whatif
from profilednn.projection.dtypes import flops_by_dtype, mfu, peak_for
from profilednn.projection.worker import llc_bytes
from profilednn.topology import MATRIX_UNIT, MIN_GEMM_SPEEDUP, cpu_topology, load_topology, topology_injection

FIXTURES = Path(__file__).parent / "fixtures" / "verbose"
pytestmark = pytest.mark.cpu_facing  # each test on the real CPU and as each CPU of tests/cpus


# ------------------------------------------------------------------ injection
def test_cpu_flags_edit_the_detected_cpu(inject_cpu) -> None:
    real = topology.detected_topology()  # through the module: the recorded CPU under a profile
    topo = inject_cpu("+avx512_bf16,+amx_bf16,-avx2")
    assert "bf16" in topo.native_dtypes and "avx2" not in topo.isa
    assert topo.physical_cores == real.physical_cores  # only the flags change
    assert "PROFILEDNN_CPU_FLAGS=+avx512_bf16" in topology_injection()
    assert topology.detected_topology().isa == real.isa  # what the silicon runs is never injected
    inject_cpu("-avx512_bf16,-amx_bf16")  # only BF16 goes: fp16 stays where the CPU has it (AMX guest)
    assert cpu_topology().native_dtypes == tuple(d for d in real.native_dtypes if d != "bf16")


def test_a_topology_file_replaces_the_cpu(inject_cpu, tmp_path) -> None:
    topo = inject_cpu(topology={"model_name": "Xeon 8480+", "physical_cores": 8, "sockets": 2,
                                "threads_per_core": 2, "isa": ["avx512f", "amx_bf16"]})
    assert (topo.model_name, topo.physical_cores, topo.sockets, topo.logical_cpus) == ("Xeon 8480+", 8, 2, 16)
    assert topo.native_dtypes == ("fp32", "bf16")
    toml = tmp_path / "zen4.toml"
    toml.write_text('model_name = "EPYC 9654"\nphysical_cores = 2\nisa = "avx512f avx512_bf16"\n')
    assert load_topology(toml).native_dtypes == ("fp32", "bf16")
    round_trip = tmp_path / "rt.json"
    round_trip.write_text(json.dumps(topo.to_dict()))
    assert load_topology(round_trip) == topo


def test_bad_injections_say_what_to_write(inject_cpu, tmp_path) -> None:
    with pytest.raises(InputError, match="not an ISA flag"):
        inject_cpu("+avx512 bf16;")
    bad = tmp_path / "t.json"
    bad.write_text("{nope")
    with pytest.raises(InputError, match="not valid JSON"):
        load_topology(bad)
    with pytest.raises(InputError, match="cannot read"):
        load_topology(tmp_path / "missing.json")


def test_the_fingerprint_records_an_injected_cpu(inject_cpu) -> None:
    assert "isa_injected" not in fingerprint()
    inject_cpu("+amx_bf16")
    fp = fingerprint()
    assert fp["native_bf16"] is True and "amx_bf16" in fp["isa_flags"]
    assert "+amx_bf16" in fp["isa_injected"]


# ------------------------------------------------------------------ per-dtype MFU
def _machine(bf16: float | None) -> MachineProfile:
    gemm = {"fp32": {2: Measurement.of([200.0])}}
    if bf16:
        gemm["bf16"] = {2: Measurement.of([bf16])}
    return MachineProfile(name="box", cpu_model="box", cores=2, gemm=gemm, native_dtypes=tuple(gemm),
                          bandwidth={2: Measurement.of([20.0])})


def test_mfu_holds_each_dtype_against_its_own_peak() -> None:
    flops = {"bf16": 8e9, "fp32": 1e9}
    peaks = {"fp32": 200.0, "bf16": 440.0}
    # 8e9 / 440e9 + 1e9 / 200e9 seconds at peak, over a 100 ms step
    assert mfu(flops, peaks, 100.0) == pytest.approx((8 / 440 + 1 / 200) / 0.1)
    assert peak_for("bf16", {"fp32": 200.0}) == 200.0  # emulated: held against fp32
    assert mfu(flops, {}, 100.0) is None and mfu(flops, peaks, None) is None


@pytest.mark.parametrize("bf16_peak", [440.0, None], ids=["native_bf16", "emulated_bf16"])
def test_projection_of_a_bf16_run_uses_the_bf16_peak(tmp_path, bf16_peak) -> None:
    run = make_run(tmp_path, dtype="bf16", native_bf16=bf16_peak is not None)
    proj = project(run, machine=_machine(bf16_peak), replay=False, write=False)
    s = proj.summary
    flops = flops_by_dtype(proj.primitives, proj.ops)
    assert set(s["flops_by_dtype"]) == {"bf16"} and s["flops_by_dtype"] == pytest.approx(flops)
    assert s["model_flops_per_step"] == pytest.approx(sum(flops.values()))
    expected_peak = bf16_peak or 200.0
    by_hand = s["model_flops_per_step"] / (s["measured_step_ms"] / 1e3) / (expected_peak * 1e9)
    assert s["mfu"] == pytest.approx(by_hand, rel=1e-9)
    assert s["peak_gflops_by_dtype"] == ({"fp32": 200.0, "bf16": bf16_peak} if bf16_peak else {"fp32": 200.0})
    mfu_line = next(a for a in proj.assumptions if a.startswith("MFU"))
    assert ("held against the fp32 peak" in mfu_line) == (bf16_peak is None)
    # the roofline of every bf16 conv uses the bf16 peak
    conv = proj.primitives.filter((pl.col("driver") == "conv") & (pl.col("bound") == "compute"))
    assert conv.height and set(conv["dtype"]) == {"bf16"}


def test_fp32_run_mfu_is_unchanged_by_a_bf16_peak(tmp_path) -> None:
    run = make_run(tmp_path)
    a = project(run, machine=_machine(None), replay=False, write=False).summary
    b = project(run, machine=_machine(880.0), replay=False, write=False).summary
    assert a["mfu"] == pytest.approx(b["mfu"]) and set(a["flops_by_dtype"]) == {"fp32"}


# ------------------------------------------------------------------ advice
def test_bf16_native_fires_only_with_native_bf16(tmp_path) -> None:
    fired = {a.rule: a for a in advise(make_run(tmp_path, native_bf16=True))}
    adv = fired["bf16_native"]
    assert "fp32 convolutions and matmuls take" in adv.evidence and "assumed 2.0x" in adv.evidence
    assert "torch.autocast('cpu', dtype=torch.bfloat16)" in adv.action and "out.float()" in adv.action
    share = float(adv.evidence.split("take ")[1].split("%")[0])
    assert share >= BF16_NATIVE_SHARE_MIN_PCT
    assert adv.estimated_gain_pct == pytest.approx(share * (1 - 1 / ASSUMED_BF16_PEAK_RATIO), abs=0.06)
    assert "bf16_native" not in {a.rule for a in advise(make_run(tmp_path, native_bf16=False))}
    # a Run already in BF16 has no fp32 compute left to move
    assert "bf16_native" not in {a.rule for a in advise(make_run(tmp_path, dtype="bf16", native_bf16=True))}


def test_an_injected_cpu_answers_what_would_you_advise_there(tmp_path, inject_cpu) -> None:
    run = make_run(tmp_path, native_bf16=False)  # captured on a CPU without BF16
    assert "bf16_native" not in {a.rule for a in advise(run)}
    inject_cpu(NATIVE_BF16_FLAGS)
    (adv,) = [a for a in advise(run) if a.rule == "bf16_native"]
    assert "ISA injected: PROFILEDNN_CPU_FLAGS=" in adv.evidence
    bf16_run = make_run(tmp_path, dtype="bf16", native_bf16=True)
    inject_cpu("-avx512_bf16,-amx_bf16")  # and the other way round
    assert "bf16_without_native_bf16" in {a.rule for a in advise(bf16_run)}


def test_bf16_native_uses_the_projected_gain_when_the_run_was_projected(tmp_path) -> None:
    run = make_run(tmp_path, native_bf16=True)
    proj = project(run, machine=_machine(440.0), replay=False, write=True)
    (adv,) = [a for a in advise(Analysis(run.path)) if a.rule == "bf16_native"]
    assert "measured bf16/fp32 GEMM peak ratio 2.20x" in adv.evidence
    speedup = whatif(proj, dtype="bf16", source=_machine(440.0)).summary["speedup"]
    assert f"{speedup:.2f}x faster" in adv.evidence
    assert adv.estimated_gain_pct == pytest.approx((1 - 1 / speedup) * 100, rel=1e-6)
    from profilednn.projection.report import report_sections

    (section,) = report_sections(run)
    assert "fp32 200 GFLOP/s, bf16 440 GFLOP/s" in section.html and "GFLOP per step" in section.html


def test_a_loss_computed_in_bf16_is_flagged(tmp_path) -> None:
    (adv,) = [a for a in advise(make_run(tmp_path, dtype="bf16", native_bf16=True)) if a.rule == "bf16_loss"]
    assert adv.severity == "high" and "aten::nll_loss_forward" in adv.evidence and ".float()" in adv.action
    right = make_run(tmp_path, dtype="bf16", native_bf16=True, loss_fp32=True)
    assert "bf16_loss" not in {a.rule for a in advise(right)}
    assert "bf16_loss" not in {a.rule for a in advise(make_run(tmp_path))}


# ------------------------------------------------------------------ BF16 verbose, recorded here
def test_bf16_fallback_log_of_a_cpu_without_native_bf16() -> None:
    """Recorded on the Zen 3 (AVX2): the autocast step logs nothing; oneDNN runs bf16 reorders
    and refuses bf16 inner product/matmul at dispatch (no native-BF16 CPU was at hand)."""
    from profilednn.projection.cases import primitive_case, unique_primitives
    from profilednn.verbose import read_log_with_report

    df, report = read_log_with_report(FIXTURES / "torch2.14_onednn3.12_bf16_fallback.log")
    execs = df.filter(pl.col("event") == "exec")
    assert execs["driver"].unique().to_list() == ["reorder"] and set(execs["src_dt"]) == {"bf16"}
    assert report.counts["dispatch"] >= 10  # every bf16 matmul/ip implementation said no
    (row,) = unique_primitives(execs).iter_rows(named=True)
    case, _ = primitive_case(row)
    assert case == {"kind": "reorder_to_blocked", "dims": [2, 3, 8, 8]}


NATIVE_BF16_LINES = """\
onednn_verbose,v1,primitive,exec,cpu,convolution,brg_conv_fwd:avx512_core_amx,forward_training,src:bf16::blocked:acdb::f0 wei:bf16:a:blocked:AcdB16b16a2b::f0 bia:f32:a:blocked:a::f0 dst:bf16::blocked:acdb::f0,attr-scratchpad:user,alg:convolution_direct,mb2_ic16oc32_ih8oh8kh3sh1dh0ph1_iw8ow8kw3sw1dw0pw1,0.01
onednn_verbose,v1,primitive,exec,cpu,matmul,brg_matmul:avx512_core_amx,undef,src:bf16::blocked:ab::f0 wei:bf16:a:blocked:BA16a32b2a::f0 dst:bf16::blocked:ab::f0,attr-scratchpad:user,,64x128:128x10,0.005
onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef,src:f32::blocked:abcd::f0 dst:bf16:a:blocked:AcdB16b16a2b::f0,attr-scratchpad:user,,32x16x3x3,0.002
"""


def test_native_bf16_primitives_decode_and_replay_in_bf16(tmp_path) -> None:
    """Lines in the format oneDNN 3.x prints on an AMX CPU (written by hand, not recorded):
    bf16 conv/matmul become bf16 replay cases and count as bf16 FLOPs."""
    from profilednn.projection.cases import primitive_case
    from profilednn.verbose import read_log

    log = tmp_path / "amx.log"
    log.write_text(NATIVE_BF16_LINES)
    df = read_log(log).filter(pl.col("event") == "exec")
    rows = {r["driver"]: r for r in df.iter_rows(named=True)}
    assert rows["conv"]["src_dt"] == "bf16" and rows["conv"]["isa"].startswith("avx512_core_amx")
    conv_case, _ = primitive_case(rows["conv"])
    mm_case, _ = primitive_case(rows["matmul"])
    assert conv_case["dtype"] == "bf16" and mm_case["dtype"] == "bf16"
    assert (rows["reorder"]["src_dt"], rows["reorder"]["dst_dt"]) == ("f32", "bf16")
    table = df.with_columns(pl.lit(1.0).alias("calls_per_step"),
                            pl.col("src_dt").replace({"f32": "fp32"}).alias("dtype"))
    flops = flops_by_dtype(table, pl.DataFrame())
    assert set(flops) == {"bf16"}
    assert flops["bf16"] == pytest.approx(rows["conv"]["flops_dense"] + 2 * 64 * 128 * 10)


# ------------------------------------------------------------------ cache facts
def test_the_detected_cpu_reports_its_caches() -> None:
    topo = cpu_topology()
    if not topo.caches:  # sysfs without cache directories (some containers)
        assert topo.llc_bytes is None and llc_bytes() == 32 << 20
        return
    data = [c for c in topo.caches if c.kind in ("Data", "Unified")]
    assert topo.llc_bytes == max(c.size_bytes for c in data) == llc_bytes()
    assert topo.cache_bytes(1) == next(c.size_bytes for c in data if c.level == 1)  # L1d, never L1i
    assert all(1 <= c.shared_cpus for c in topo.caches)
    assert topo.cache_bytes(9) is None
    assert topology.topology_from_dict(topo.to_dict()).caches == topo.caches


# ------------------------------------------------------------------ native means faster
# Which reduced dtypes pay on each recorded CPU (its machine file's peaks, its matrix units).
PAYS = {"intel-amx-2core": {"bf16"}, "amd-zen3-2core": set(), "amd-zen4-2core": {"bf16"}}


def test_a_dtype_pays_where_measured_faster_or_a_matrix_unit_computes_it(cpu_profile) -> None:
    machine = get_machine()
    faster, peaks = machine.faster_dtypes(), machine.peaks
    for d in ("bf16", "fp16"):
        pays = peaks[d] >= MIN_GEMM_SPEEDUP * peaks["fp32"] if d in peaks else MATRIX_UNIT[d] in machine.isa
        assert (d in faster) == pays, (d, faster, peaks)
    if cpu_profile != REAL and not SUITE_FLAGS:  # the recorded CPU as it is
        assert set(faster) == PAYS[cpu_profile]
    if cpu_profile == "intel-amx-2core":  # avx512_fp16 lists fp16 as native; it runs below fp32
        assert "fp16" in cpu_topology().native_dtypes
        assert "0.91x" in machine.dtype_speed("fp16").reason and not machine.dtype_speed("fp16").faster


def test_whatif_projects_a_dtype_only_where_it_pays(tmp_path) -> None:
    proj = project(make_run(tmp_path), replay=False, write=False)  # against this machine's profile
    machine = get_machine()
    for d in ("bf16", "fp16"):
        if d in machine.faster_dtypes() and d in machine.gemm:
            assert whatif(proj, dtype=d).summary["speedup"] > 1.0
        else:
            with pytest.raises(InputError, match=f"{d} is not projected as a speed-up|{d} pays there .* no measured"):
                whatif(proj, dtype=d)


def test_validate_refuses_a_dtype_that_does_not_pay_before_profiling(tmp_path) -> None:
    from profilednn.projection.validate import validate

    slower = [d for d in ("bf16", "fp16") if d not in get_machine().faster_dtypes()]
    for d in slower:
        with pytest.raises(InputError, match="not projected as a speed-up"):
            validate(make_run(tmp_path), dtype=d, runs_dir=tmp_path / "b")
    assert not (tmp_path / "b").exists()


def test_dtype_policy_tries_bf16_only_where_it_pays() -> None:
    import torch
    from torch import nn

    from profilednn.optimization import RECIPES, Context, TrainStep
    from profilednn.optimization.engine import precision_peaks

    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 4 * 4, 2))
    setup = TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(),
                       [(torch.randn(2, 3, 6, 6), torch.tensor([0, 1]))])
    recipe = RECIPES["dtype_policy"]
    topo = cpu_topology()
    reason = recipe.check(setup, Context(topo, gemm_peaks=precision_peaks([recipe], topo)))
    assert (reason is None) == ("bf16" in get_machine().faster_dtypes()), reason


def test_bf16_advice_for_a_run_captured_here_follows_where_bf16_pays(tmp_path) -> None:
    topo = cpu_topology()
    here = {"cpu_model": topo.model_name, "isa_flags": sorted(topo.isa), "native_bf16": "bf16" in topo.native_dtypes}
    fired = {a.rule: a for a in advise(make_run(tmp_path, native_bf16=True, extra_fingerprint=here))}
    assert ("bf16_native" in fired) == ("bf16" in get_machine().faster_dtypes())
    if "bf16_native" in fired and MATRIX_UNIT["bf16"] not in topo.isa:  # Zen 4: the cached profile decided
        assert "(this machine's profile)" in fired["bf16_native"].evidence


def test_vector_bf16_without_a_measurement_is_not_advised(tmp_path) -> None:
    zen4 = {"isa_flags": ["avx2", "fma", "avx512f", "avx512_bf16"], "native_bf16": True}
    run = make_run(tmp_path, native_bf16=True, extra_fingerprint=zen4)
    assert "bf16_native" not in {a.rule for a in advise(run)}
    project(run, machine=_machine(437.0), replay=False, write=True)  # measured: bf16 2.2x fp32
    (adv,) = [a for a in advise(Analysis(run.path)) if a.rule == "bf16_native"]
    assert "measured bf16 GEMM 437 vs fp32 200 GFLOP/s (2.19x)" in adv.evidence


def test_the_machine_printer_names_the_dtypes_that_pay() -> None:
    from rich.console import Console

    from profilednn.projection.terminal import print_machine

    console = Console(record=True, width=200)
    machine = get_machine()
    print_machine(machine, console)
    line = next(x for x in console.export_text().splitlines() if x.startswith("faster than fp32:"))
    assert all(d in line for d in machine.faster_dtypes()) and ("fp16 (" in line) == ("fp16" in machine.faster_dtypes())

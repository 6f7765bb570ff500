"""The probe before a job uses the cached peaks: within its noise the cache holds, beyond it
the peaks are scaled and said; the Run keeps the machine it ran on (issue 47)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import pytest

from profilednn.cli import run_cli
from profilednn.hardware import drift
from profilednn.hardware.machine import MachineProfile, Measurement, cached_machine_path, load_machine_file
from profilednn.hardware.probe import TRIAD, Probe, ProbeFigure, ProbeReference, combine_rounds, run_probe
from profilednn.projection import project, whatif
from profilednn.projection.projector import MANIFEST_KEY, load_projection
from profilednn.run import load_run
from runfactory import make_run

# what the profile's probe measured at 1 and 2 threads when its peaks were measured (noise 2%)
REFERENCE = ProbeReference({t: {"fp32": ProbeFigure(60.0 * t, 0.02), TRIAD: ProbeFigure(20.0, 0.02)}
                            for t in (1, 2)}, taken="2025-03-01T17:11:00+00:00")


def _machine() -> MachineProfile:
    return MachineProfile(
        name="cached box", cpu_model="cached", cores=2, native_dtypes=("fp32",),
        gemm={"fp32": {1: Measurement.of([90.0]), 2: Measurement.of([180.0])}},
        bandwidth={1: Measurement.of([25.0]), 2: Measurement.of([30.0])}, measured="2025-03-01T17:11:00+00:00",
        source="measured", measured_at={"gemm": "2025-03-01T17:11:00+00:00"}, probe_reference=REFERENCE.to_dict(),
        cache_bytes=32 << 20, page_fault_ms_per_mib=0.2)


def probe_at(ratio: float, noise: float = 0.01, triad_ratio: float | None = None):
    """A probe function that answers ``ratio`` x the reference (the injected machine speed)."""
    calls: list[tuple[int, tuple[str, ...]]] = []

    def fn(threads: int, dtypes: Sequence[str]) -> Probe:
        calls.append((threads, tuple(dtypes)))
        ref = REFERENCE.by_threads[threads]
        figs = {d: ProbeFigure(ref[d].value * ratio, noise) for d in dtypes}
        figs[TRIAD] = ProbeFigure(ref[TRIAD].value * (ratio if triad_ratio is None else triad_ratio), noise)
        return Probe(threads, figs, "2025-03-01T19:06:00+00:00", 0.2)

    fn.calls = calls  # type: ignore[attr-defined]
    return fn


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("PROFILEDNN_CACHE_DIR", str(tmp_path / "cache"))
    drift._memo.clear()
    return _machine().save(cached_machine_path())


def test_a_probe_30pct_below_the_cache_scales_the_peaks_and_says_so() -> None:
    probe = probe_at(0.7)
    check = drift.check_machine(_machine(), 2, probe=probe, remeasure=drift.scale_by_probe)
    assert probe.calls == [(2, ("fp32",))]  # at the job's threads, the dtypes it uses
    assert check.verdict == drift.SCALED and check.drifted
    assert check.machine.gemm_peak_gflops("fp32", 2) == pytest.approx(180.0 * 0.7)
    assert check.machine.bandwidth_at(2) == pytest.approx(30.0 * 0.7)
    assert "30% slower than its profile of 2025-03-01 17:11" in check.note and "--refresh" in check.note
    assert "re-measured for this job at 2 thread(s): fp32 GEMM 126.0 GFLOP/s, triad 21.0 GB/s" in check.note
    assert check.tolerance["fp32"] == pytest.approx(0.02)  # the reference's measured noise


def test_how_far_the_machine_moved_is_the_full_size_re_measurement_not_the_probe() -> None:
    # a 0.3 s probe just after a child process exits read 0.15x of the GEMM peak (pytorch/examples'
    # dcgan under optimize); re-measured at full size the peaks agreed with the profile
    def as_profiled(machine, threads, moved):
        return drift.scale_by_probe(machine, threads, dict.fromkeys(moved, 1.01))

    check = drift.check_machine(_machine(), 2, probe=probe_at(0.15), remeasure=as_profiled)
    assert check.verdict == drift.SCALED and check.machine.gemm_peak_gflops("fp32", 2) == pytest.approx(180.0 * 1.01)
    assert "ran 85% slower" not in check.note and "85%" not in check.note
    assert "a probe at 2 thread(s) read fp32 GEMM 0.15x, triad 0.15x of this machine's profile of 2025-03-01 17:11" \
        in check.note
    assert "agree with it (fp32 GEMM 181.8 GFLOP/s, triad 30.3 GB/s: fp32 GEMM 1.01x, triad 1.01x)" in check.note
    assert "a passing load during the probe" in check.note
    # a machine that did slow down, by less than the probe read: the note says the re-measured 20%
    def slower(machine, threads, moved):
        return drift.scale_by_probe(machine, threads, dict.fromkeys(moved, 0.8))

    check = drift.check_machine(_machine(), 2, probe=probe_at(0.15), remeasure=slower)
    assert "20% slower than its profile of 2025-03-01 17:11 (probe at 2 thread(s): fp32 GEMM 0.15x" in check.note
    assert "fp32 GEMM 144.0 GFLOP/s, triad 24.0 GB/s (fp32 GEMM 0.80x, triad 0.80x of the profile)" in check.note
    assert drift.full_ratios(_machine(), check.machine, 2, {"fp32": 0.15, TRIAD: 0.15}) == pytest.approx(
        {"fp32": 0.8, TRIAD: 0.8})
    # the GEMM re-measured as profiled, the bandwidth 30% down: the bandwidth is what moved
    def bandwidth_down(machine, threads, moved):
        return drift.scale_by_probe(machine, threads, {"fp32": 1.01, TRIAD: 0.7})

    check = drift.check_machine(_machine(), 2, probe=probe_at(0.15), remeasure=bandwidth_down)
    assert "this machine ran 30% slower than its profile" in check.note and "1% faster" not in check.note


def test_a_probe_within_its_noise_keeps_the_cache_without_a_note() -> None:
    check = drift.check_machine(_machine(), 2, probe=probe_at(0.99, noise=0.3))  # a noisy probe changes nothing
    assert check.verdict == drift.CACHE and check.note is None
    assert check.machine.gemm_peak_gflops("fp32", 2) == 180.0
    # a 2% move against a quiet reference is beyond the noise
    quiet = _machine()
    quiet.probe_reference = ProbeReference({2: {"fp32": ProbeFigure(120.0, 0.005),
                                                TRIAD: ProbeFigure(20.0, 0.005)}}).to_dict()
    assert drift.check_machine(quiet, 2, probe=probe_at(0.98), remeasure=drift.scale_by_probe).verdict == drift.SCALED


def test_only_the_figures_that_moved_are_scaled() -> None:
    check = drift.check_machine(_machine(), 1, probe=probe_at(1.0, triad_ratio=0.6), remeasure=drift.scale_by_probe)
    assert check.verdict == drift.SCALED
    assert check.machine.gemm_peak_gflops("fp32", 1) == 90.0 and check.machine.bandwidth_at(1) == pytest.approx(15.0)
    assert "40% slower" in check.note


def test_a_profile_without_a_probe_reference_is_used_unchecked_and_nothing_runs() -> None:
    old = _machine()
    old.probe_reference = {}
    probe = probe_at(0.5)
    check = drift.check_machine(old, 2, probe=probe)
    assert check.verdict == drift.UNCHECKED and probe.calls == [] and "--refresh" in check.note


def test_project_against_a_drifted_machine_stores_the_machine_and_the_note(tmp_path) -> None:
    run = make_run(tmp_path / "runs")
    steady = project(run, replay=False, write=False, probe=probe_at(1.0))
    assert steady.summary["machine_check"] == "cache" and "machine_note" not in steady.summary
    assert not any("slower" in a for a in steady.assumptions)
    slow = project(run, replay=False, write=True, probe=probe_at(0.7), remeasure=drift.scale_by_probe)
    s = slow.summary
    assert s["machine_check"] == "scaled" and "30% slower" in s["machine_note"]
    assert s["machine_note"] in slow.assumptions[:2]
    # MFU and the peaks against the scaled machine: the same FLOPs at 0.7x the peak
    assert s["gemm_peak_gflops"] == pytest.approx(0.7 * steady.summary["gemm_peak_gflops"])
    assert s["mfu"] == pytest.approx(steady.summary["mfu"] / 0.7)
    assert s["bandwidth_gbs"] == pytest.approx(0.7 * steady.summary["bandwidth_gbs"])
    # the Run keeps the machine: its peaks, the probe and the ratios
    stored = load_run(run.path).manifest[MANIFEST_KEY]["machine"]
    assert stored["check"] == "scaled" and stored["probe"]["figures"]["fp32"]["value"] == pytest.approx(84.0)
    assert stored["peak_gflops"]["fp32"] == pytest.approx(s["gemm_peak_gflops"])
    assert stored["ratios"]["fp32"] == pytest.approx(0.7)
    # the history beside the cache holds both checks
    assert [e["verdict"] for e in drift.probe_history()] == ["cache", "scaled"]


def test_an_old_run_uses_its_stored_figures_and_a_what_if_says_which_machine(tmp_path) -> None:
    run = make_run(tmp_path / "runs")
    project(run, replay=False, write=True, probe=probe_at(0.7), remeasure=drift.scale_by_probe)
    # re-projected without a replay: the stored machine, no probe now
    probe = probe_at(1.0)
    again = project(load_run(run.path), replay=False, write=False, probe=probe)
    assert probe.calls == [] and again.summary["machine_check"] == "stored"
    assert again.summary["gemm_peak_gflops"] == pytest.approx(0.7 * 180.0)
    proj = load_projection(run.path)
    w = whatif(proj, threads=1)
    assert "as stored in the Run" in w.summary["source_basis"] and "2025-03-01 17:11" in w.summary["source_basis"]
    # a Run projected before Runs kept their machine still loads; the what-if falls back and says so
    manifest = json.loads((run.path / "manifest.json").read_text())
    del manifest[MANIFEST_KEY]["machine"]
    (run.path / "manifest.json").write_text(json.dumps(manifest))
    old = load_projection(run.path)
    assert old is not None and old.machine is None and old.machine_profile is None
    assert "this machine's cached profile" in whatif(old, threads=1).summary["source_basis"]


def test_the_history_is_bounded(tmp_path) -> None:
    for i in range(drift.HISTORY_LENGTH + 5):
        drift.checked_machine(2, probe=probe_at(1.0 - i / 100), remeasure=drift.scale_by_probe)
    hist = drift.probe_history()
    assert len(hist) == drift.HISTORY_LENGTH and hist[-1]["ratios"]["fp32"] == pytest.approx(1.0 - 24 / 100)


def test_machine_verb_shows_when_figures_were_measured_and_the_last_probes(monkeypatch, capsys) -> None:
    monkeypatch.setattr(drift, "run_probe", probe_at(0.7))
    monkeypatch.setattr(drift, "remeasure_at", drift.scale_by_probe)  # no real measuring in a test
    assert run_cli(["machine"]) == 0
    out = capsys.readouterr()
    assert "gemm 2025-03-01 17:11" in out.out and "Probe reference" in out.out and "Last probes" in out.out
    assert "fp32 0.70x" in out.out and "30% slower" in out.err
    assert run_cli(["machine", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["probe_reference"]["figures"] and len(data["probe_history"]) == 2


def test_the_reference_survives_the_machine_file(tmp_path) -> None:
    back = load_machine_file(_machine().save(tmp_path / "m.toml"))
    ref = ProbeReference.from_dict(back.probe_reference)
    assert ref is not None and ref.by_threads[2]["fp32"] == ProbeFigure(120.0, 0.02)
    assert back.measured_at == {"gemm": "2025-03-01T17:11:00+00:00"}


def test_combined_rounds_take_the_larger_of_their_range_and_their_noise() -> None:
    rounds = [Probe(1, {"fp32": ProbeFigure(v, 0.01)}) for v in (100.0, 104.0, 98.0)]
    fig = combine_rounds(rounds)["fp32"]
    assert fig.value == 100.0 and fig.noise == pytest.approx(0.06)


def test_a_real_probe_at_a_tiny_size_measures_each_figure() -> None:
    p = run_probe(1, ["fp32"], gemm_n=32, triad_mib=1, samples=4)
    assert set(p.figures) == {"fp32", TRIAD} and all(f.value > 0 and f.noise >= 0 for f in p.figures.values())

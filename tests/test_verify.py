"""benchmarks/verify.py: the plan per host (injected), the budget, a check that crashes or
hangs, bad input, and one real check end to end in a child process."""

from __future__ import annotations


import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
VERIFY = BENCH / "verify.py"
sys.path.insert(0, str(BENCH))

from verifykit.catalogue import CHECKS, Check  # noqa: E402
from verifykit.host import Host  # noqa: E402

from profilednn.topology import bf16_tier  # noqa: E402
from verifykit.rows import Row, verify_md  # noqa: E402
from verifykit.runner import run_checks  # noqa: E402


def _verify(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(VERIFY), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def _host_file(tmp_path: Path, **fields) -> str:
    path = tmp_path / "host.json"
    path.write_text(json.dumps(fields))
    return str(path)


def test_two_core_host_without_cuda_says_why_each_part_cannot_run(tmp_path):
    host = _host_file(tmp_path, cores=2, cuda=[], tier="none")
    proc = _verify("--dry-run", "--host", host, "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads((tmp_path / "out" / "verify.json").read_text())
    by_part = {}
    for row in data["rows"]:
        by_part.setdefault(row["part"], set()).add((row["status"], row["reason"]))
    assert by_part["CUDA"] == {("n/a", "no CUDA")}
    assert by_part["8+ cores"] == {("n/a", "2 cores (needs 8 or more)")}
    assert {s for s, _ in by_part["any CPU"]} == {"skipped"}
    assert data["machine"]["cores"] == 2 and "injected host" in data["machine"]["name"]
    md = (tmp_path / "out" / "verify.md").read_text()
    assert md.startswith("# verify: ") and "| CUDA | footprint_gpu |" in md and "no CUDA" in md


def test_many_core_gpu_host_plans_every_part(tmp_path):
    host = _host_file(tmp_path, cores=16, cuda=["NVIDIA H200"], tier="amx")
    proc = _verify("--dry-run", "--host", host, "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads((tmp_path / "out" / "verify.json").read_text())["rows"]
    assert {r["status"] for r in rows} == {"skipped"}  # planned, none n/a
    assert {r["check"] for r in rows} == {c.name for c in CHECKS}
    assert {r["part"] for r in rows} == {"any CPU", "8+ cores", "CUDA"}


def test_out_defaults_to_the_device_tools_out_variable(tmp_path):
    out = tmp_path / "device-out"
    proc = subprocess.run([sys.executable, str(VERIFY), "--dry-run", "--only", "peaks"], cwd=tmp_path,
                          capture_output=True, text=True, env={**os.environ, "OUT": str(out)})
    assert proc.returncode == 0, proc.stderr
    assert (out / "verify.json").is_file() and (out / "verify.md").is_file()


@pytest.mark.parametrize("args, message", [
    (["--only", "peaks,warp_drive"], "unknown check(s) warp_drive"),
    (["--budget-s", "0"], "--budget-s must be > 0"),
])
def test_bad_options_exit_2_with_one_line(tmp_path, args, message):
    proc = _verify("--dry-run", *args, cwd=tmp_path)
    assert proc.returncode == 2 and message in proc.stderr
    assert not (tmp_path / "verify-out").exists()


@pytest.mark.parametrize("content, message", [
    ('{"cores": 0}', "cores must be a positive integer"),
    ('{"tier": "amx_fp8"}', "tier must be one of amx, avx512_bf16, none"),
    ('{"gpus": 2}', "unknown field(s) gpus"),
    ("not json", "cannot read a JSON host file"),
])
def test_bad_host_file_is_one_line_and_writes_nothing(tmp_path, content, message):
    (tmp_path / "host.json").write_text(content)
    proc = _verify("--dry-run", "--host", str(tmp_path / "host.json"), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and message in proc.stderr
    assert not (tmp_path / "out").exists()


def test_tier_comes_from_the_isa():
    assert bf16_tier({"avx2", "avx512_bf16", "amx_bf16"}) == "amx"
    assert bf16_tier({"avx2", "avx512f", "avx512_bf16"}) == "avx512_bf16"
    assert bf16_tier({"avx2", "fma"}) == "none"


FAKE_CHECKS = textwrap.dedent('''
    import time
    from verifykit.rows import Row

    def fine(host, quick):
        return [Row.judged("any CPU", "fine", "two is at least one", 2 >= 1, "2", 2.0)]

    def crash(host, quick):
        raise RuntimeError("the kernel fell over")

    def hang(host, quick):
        time.sleep(600)
        return []
''')


def _fake(name: str, fn: str, estimate: float) -> Check:
    return Check(name, "any CPU", (f"{name} target",), lambda host: None, estimate, estimate, f"fakechecks:{fn}")


@pytest.fixture
def fake_checks(tmp_path, monkeypatch):
    (tmp_path / "fakechecks.py").write_text(FAKE_CHECKS)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{BENCH}")
    return tmp_path


HOST = Host(cpu="test CPU", cores=2, tier="none")


def test_runner_keeps_rows_and_turns_a_crash_into_an_error_row(fake_checks):
    log = open(fake_checks / "verify.log", "w+")
    out = run_checks(HOST, [_fake("fine", "fine", 1), _fake("crash", "crash", 1)], budget_s=300.0, quick=True,
                     work=fake_checks, log=log, progress=lambda m: None)
    by = {r.check: r for r in out.rows}
    assert by["fine"].status == "met" and by["fine"].figure == "2" and by["fine"].value == 2.0
    assert by["crash"].status == "error" and "the kernel fell over" in by["crash"].reason
    log.seek(0)
    assert "==> crash" in log.read()


def test_runner_stops_a_check_that_runs_past_the_budget(fake_checks):
    log = open(fake_checks / "verify.log", "w+")
    out = run_checks(HOST, [_fake("hang", "hang", 1)], budget_s=8.0, quick=True, work=fake_checks, log=log,
                     progress=lambda m: None)
    assert [(r.check, r.status) for r in out.rows] == [("hang", "error")]
    assert "ran past the" in out.rows[0].reason


def test_runner_skips_what_no_longer_fits_the_budget_and_lists_it(fake_checks):
    checks = [_fake("fine", "fine", 1), _fake("big", "fine", 500), _fake("small", "fine", 1)]
    log = open(fake_checks / "verify.log", "w+")
    out = run_checks(HOST, checks, budget_s=60.0, quick=True, work=fake_checks, log=log, progress=lambda m: None)
    by = {r.check: r for r in out.rows}
    assert out.skipped_for_time == ["big"]
    assert by["big"].status == "skipped" and "for time" in by["big"].reason
    assert by["small"].status == "met"  # a smaller check after it still runs


def test_runner_scales_estimates_by_how_slow_the_checks_ran(fake_checks):
    """A check estimated at 0.01 s that takes ~1 s makes the next estimate ~100x larger."""
    clock = iter(float(t) for t in (0, 0, 0, 5, 5, 5, 5, 5))
    checks = [_fake("fine", "fine", 0.05), _fake("second", "fine", 1.0)]
    log = open(fake_checks / "verify.log", "w+")
    out = run_checks(HOST, checks, budget_s=50.0, quick=True, work=fake_checks, log=log, progress=lambda m: None,
                     clock=lambda: next(clock))
    assert out.skipped_for_time == ["second"]  # 1 s x (5 s / 0.05 s) = 100 s > 50 s - 5 s


def test_md_escapes_cells_and_counts_statuses():
    rows = [Row("any CPU", "peaks", "a | b", "met", figure="1"), Row("CUDA", "x", "t", "n/a", reason="no CUDA")]
    md = verify_md(rows, {"name": "m"}, {"started": "now", "elapsed_s": 1.0, "budget_s": 480.0})
    assert "a \\| b" in md and "1 met, 1 n/a" in md


def test_row_rejects_an_unknown_status():
    with pytest.raises(ValueError, match="row status"):
        Row("any CPU", "c", "t", "passed")


@pytest.mark.slow
def test_a_real_check_runs_in_its_child_and_is_judged(tmp_path, monkeypatch):
    """The kernels check, quick shapes: real focal loss vs torch.compile and a real LAMB step."""
    monkeypatch.setenv("PROFILEDNN_CACHE_DIR", str(tmp_path / "cache"))
    proc = _verify("--quick", "--only", "kernels", "--budget-s", "400", "--out", str(tmp_path / "out"), cwd=tmp_path)
    data = json.loads((tmp_path / "out" / "verify.json").read_text())
    rows = data["rows"]
    assert [r["check"] for r in rows] == ["kernels", "kernels"], proc.stdout + proc.stderr
    assert {r["status"] for r in rows} <= {"met", "missed"}, rows
    assert all(r["value"] and r["value"] > 0 for r in rows)
    assert proc.returncode == (1 if any(r["status"] == "missed" for r in rows) else 0)
    assert "==> kernels" in (tmp_path / "out" / "verify.log").read_text()


# ---------------------------------------------------------------- the device launcher
import device_needs  # noqa: E402

DEVICE_VERIFY = BENCH / "device_verify.sh"


def test_device_needs_lists_absent_and_too_old_packages_never_torch(monkeypatch):
    have = {"polars": None, "typer": "0.20.1", "click": "8.3.0"}

    def fake_version(name):
        if name in have:
            if have[name] is None:
                raise device_needs.PackageNotFoundError(name)
            return have[name]
        return "99.0"

    monkeypatch.setattr(device_needs, "version", fake_version)
    needs = device_needs.missing()
    pins = device_needs.pinned()
    assert needs == [f"polars=={pins['polars']}", f"typer=={pins['typer']}"]
    assert not any(n.startswith(("torch", "nvidia")) for n in device_needs.NEEDS)


def test_device_launcher_runs_verify_with_the_hosts_torch_and_leaves_results_in_out(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "out"),
           "VERIFY_SITE": str(tmp_path / "site")}
    proc = subprocess.run(["bash", str(DEVICE_VERIFY), "--dry-run", "--only", "peaks,offload_gpu"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads((tmp_path / "out" / "verify.json").read_text())["rows"]
    assert {r["check"] for r in rows} == {"peaks", "offload_gpu"}
    assert "device_verify: torch " in (tmp_path / "out" / "verify.log").read_text()
    assert not (tmp_path / "site").exists()  # nothing was missing, nothing installed


def test_device_launcher_without_torch_stops_with_its_reason(tmp_path):
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    env = {**os.environ, "PYTHON": str(tmp_path / "bare" / "bin" / "python"),
           "OUT": str(tmp_path / "out")}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(["bash", str(DEVICE_VERIFY)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2
    assert "no torch in" in proc.stderr and "host's own torch" in proc.stderr


@pytest.mark.slow
@pytest.mark.zoo
def test_cuda_checks_run_their_whole_path_on_the_cpu_device(monkeypatch, one_thread):
    """No GPU here: the CUDA checks run with the CPU as their device (quick shapes) so a
    renamed key or argument fails here, not on the rare machine with a GPU."""
    from verifykit import cuda_checks

    monkeypatch.setattr(cuda_checks, "GPU", "cpu")
    monkeypatch.setattr(cuda_checks, "reset_peak", lambda: None)
    monkeypatch.setattr(cuda_checks, "peak_bytes", lambda: 1)
    host = Host(cpu="test", cores=2, tier="none", cuda=("CPU as the device",))
    rows = (cuda_checks.footprint_gpu(host, True) + cuda_checks.offload_gpu(host, True)
            + cuda_checks.pipeline_gpu(host, True) + cuda_checks.gpu_profile(host, True))
    assert [r.check for r in rows] == ["footprint_gpu", "offload_gpu", "offload_gpu", "pipeline_gpu", "gpu_profile"]
    assert all(r.part == "CUDA" for r in rows)
    measured = [r for r in rows if r.check != "gpu_profile"]
    assert all(r.status in ("met", "missed") and r.value is not None and r.figure for r in measured)
    assert "save_on_cpu" in rows[1].figure and "GPU alone" in rows[3].figure
    assert rows[-1].status == "n/a" and "CPU steps only" in rows[-1].reason

"""Suite-wide fixtures and hooks.

- ``inject_cpu`` / ``no_bf16_cpu`` / ``native_bf16_cpu`` / ``any_cpu``: inject ISA facts through
  ``profilednn.topology``'s ``PROFILEDNN_CPU_FLAGS`` (or a ``PROFILEDNN_TOPOLOGY`` file) for one
  test, so both branches of an ISA check run on any CPU. No test sees an injection the shell
  exported; ``PROFILEDNN_TEST_CPU_FLAGS`` injects flags into the whole suite instead.
- Tests marked ``cpu_facing`` (they branch on the CPU: ISA, cores, caches, machine peaks) run
  once on the real CPU and once under each recorded CPU of ``tests/cpus`` (ids ``[real]``,
  ``[intel-amx-2core]``, ...): ``tests/cpuprofiles.py`` makes that CPU the *detected* one and
  its machine file the cached machine profile. ``PROFILEDNN_TEST_CPU=NAME`` runs the whole
  suite as NAME instead (``real``: the real CPU only); tests marked ``real_cpu`` (they check
  what this machine's OS or silicon reports) are skipped under a suite-wide profile.
- Tests marked ``zoo`` skip cleanly where the [zoo] extra (torchvision, scikit-learn) is
  absent: the compatibility venv of ``make compat`` (an older torch, no torchvision) runs
  part of the suite, and a test that builds a torchvision model or loads scikit-learn's
  digits says so with ``@pytest.mark.zoo`` (or ``pytestmark = pytest.mark.zoo``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from cpuprofiles import REAL, apply_profile, load_profile, profile_names, suite_cpu

from profilednn.extras import OPTIONAL_PACKAGES, has_optional
from profilednn.topology import ENV_CPU_FLAGS, ENV_ONEDNN_MAX_ISA, ENV_TOPOLOGY, CpuTopology, cpu_topology


NATIVE_BF16_FLAGS = "+avx512f,+avx512bw,+avx512vl,+avx512_bf16,+amx_tile,+amx_bf16"
NO_BF16_FLAGS = "-avx512_bf16,-amx_bf16,-avx512_fp16,-amx_fp16"
# PROFILEDNN_TEST_CPU_FLAGS=+avx512_bf16,+amx_bf16 pytest: the whole suite as on a CPU with native
# BF16. It pretends the *detected* CPU has these flags (in this process; child processes and the
# native-kernel build see the real one), so Runs and advice behave as on such a machine rather
# than as under a user's injection.
SUITE_FLAGS = os.environ.get("PROFILEDNN_TEST_CPU_FLAGS", "").strip()
SUITE_CPU = suite_cpu()  # PROFILEDNN_TEST_CPU: the whole suite as one recorded CPU


def _edit_flags(flags: set[str], edits: str) -> set[str]:
    out = set(flags)
    for item in (e.strip().lower() for e in edits.split(",") if e.strip()):
        (out.discard if item.startswith("-") else out.add)(item.lstrip("+-"))
    return out


@pytest.fixture(scope="session")
def _profile_caches(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where each profile's machine file stands as the cached machine profile."""
    return tmp_path_factory.mktemp("cpu-profile-caches")


@pytest.fixture(scope="session", autouse=True)
def _suite_cpu(_profile_caches: Path):
    """``PROFILEDNN_TEST_CPU=NAME``: every test (and every module-scoped Run) runs as NAME."""
    if SUITE_CPU in (None, REAL):
        yield
        return
    with pytest.MonkeyPatch.context() as mp:
        apply_profile(mp, load_profile(SUITE_CPU), _profile_caches / SUITE_CPU)
        yield


@pytest.fixture
def cpu_profile(request: pytest.FixtureRequest) -> str:
    """The CPU this test runs as: ``real`` or a profile of ``tests/cpus`` (parametrized for
    tests marked ``cpu_facing``; ``PROFILEDNN_TEST_CPU`` for the whole suite)."""
    return getattr(request, "param", SUITE_CPU or REAL)


@pytest.fixture(autouse=True)
def _hermetic_cpu(monkeypatch: pytest.MonkeyPatch, cpu_profile: str, _profile_caches: Path) -> None:
    """Every test starts from the detected CPU (a recorded one for a ``cpu_facing`` test's
    profile), whatever injection or oneDNN ISA cap the shell exported."""
    monkeypatch.delenv(ENV_TOPOLOGY, raising=False)
    monkeypatch.delenv(ENV_CPU_FLAGS, raising=False)
    for variable in ENV_ONEDNN_MAX_ISA:
        monkeypatch.delenv(variable, raising=False)
    if cpu_profile not in (REAL, SUITE_CPU):
        apply_profile(monkeypatch, load_profile(cpu_profile), _profile_caches / cpu_profile)
    if SUITE_FLAGS:
        from profilednn import topology
        from profilednn.capture import fingerprint

        real_topology, real_cpuinfo = topology.detected_topology, fingerprint._cpuinfo
        monkeypatch.setattr(topology, "detected_topology",
                            lambda: topology.with_cpu_flags(real_topology(), SUITE_FLAGS))
        monkeypatch.setattr(fingerprint, "_cpuinfo",
                            lambda: (real_cpuinfo()[0], _edit_flags(real_cpuinfo()[1], SUITE_FLAGS)))


@pytest.fixture
def inject_cpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[..., CpuTopology]:
    """``inject_cpu("-avx512_bf16,+amx_bf16")``: the detected CPU with these ISA edits, for the
    rest of the test; ``inject_cpu(topology={...})`` replaces the whole topology
    (``CpuTopology.to_dict``'s shape or the short form). Child processes inherit it (it is the
    environment). Returns the topology every job now sees."""

    def inject(edits: str | None = None, topology: dict | None = None) -> CpuTopology:
        if topology is not None:
            path = tmp_path / "injected-topology.json"
            path.write_text(json.dumps(topology))
            monkeypatch.setenv(ENV_TOPOLOGY, str(path))
        if edits is not None:
            monkeypatch.setenv(ENV_CPU_FLAGS, edits)
        return cpu_topology()

    return inject


@pytest.fixture
def no_bf16_cpu(inject_cpu: Callable[..., CpuTopology]) -> CpuTopology:
    """The detected CPU without native BF16, whatever this machine has."""
    return inject_cpu(NO_BF16_FLAGS)


@pytest.fixture
def native_bf16_cpu(inject_cpu: Callable[..., CpuTopology]) -> CpuTopology:
    """The detected CPU with native BF16 added (AVX-512 BF16 and AMX flags)."""
    return inject_cpu(NATIVE_BF16_FLAGS)


@pytest.fixture(params=["native_bf16", "no_bf16"])
def any_cpu(request: pytest.FixtureRequest, inject_cpu: Callable[..., CpuTopology]) -> CpuTopology:
    """Runs the test on both branches: an injected CPU with native BF16 and one without."""
    return inject_cpu(NATIVE_BF16_FLAGS if request.param == "native_bf16" else NO_BF16_FLAGS)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A ``cpu_facing`` test runs on the real CPU and as each recorded CPU."""
    if metafunc.definition.get_closest_marker("cpu_facing") and SUITE_CPU is None:
        metafunc.parametrize("cpu_profile", [REAL, *profile_names()], indirect=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if SUITE_CPU not in (None, REAL):
        real_only = pytest.mark.skip(reason=f"checks this machine's own CPU; PROFILEDNN_TEST_CPU={SUITE_CPU}")
        for item in items:
            if item.get_closest_marker("real_cpu") is not None:
                item.add_marker(real_only)
    missing = [OPTIONAL_PACKAGES[p][0] for p in OPTIONAL_PACKAGES if not has_optional(p)]
    if not missing:
        return
    skip = pytest.mark.skip(
        reason=f"needs the [zoo] extra: {', '.join(missing)} not installed (pip install 'profilednn[zoo]')"
    )
    for item in items:
        if item.get_closest_marker("zoo") is not None:
            item.add_marker(skip)


@pytest.fixture
def one_thread():
    """torch's intra-op pool at 1 thread for the test, restored after. For tests that compute
    in pytest's own process: tiny layers spend their time in thread hand-offs, and 2 OpenMP
    threads wait on each other whenever the suite's other worker holds a core (the CUDA-path
    check of test_verify: 35 s alone, 75 s beside one busy core, 44 s there with 1 thread, on
    a 2-core AMD EPYC). Nothing a test asserts may depend on it."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

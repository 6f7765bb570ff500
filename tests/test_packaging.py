"""Packaging: dependencies are ranges, the lock pins them, and the built wheel installs into
a user's environment without touching the torch already there.

The last group runs in `make compat` (the compatibility venv: torch 2.13 CPU, no
torchvision, the wheel from `python -m build` installed with its ranges); elsewhere it skips.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from torch_identity import torch_identity

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# torch releases the suite runs on: `make compat-oldest`'s (the oldest supported; the device
# machine's), `make compat`'s and the main venv's.
TESTED_TORCH = ("2.11.0", "2.13.0", "2.14.1")
ZOO = {"torchvision", "scikit-learn"}


def _requirements(group: list[str]) -> dict[str, Requirement]:
    reqs = [Requirement(text) for text in group]
    return {canonicalize_name(r.name): r for r in reqs}


def _lock() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not an exact pin NAME==VERSION"
            pins[canonicalize_name(name)] = Version(version)
    return pins


DEPENDENCIES = _requirements(PROJECT["dependencies"])
EXTRAS = {extra: _requirements(reqs) for extra, reqs in PROJECT["optional-dependencies"].items()}


def test_dependencies_are_ranges_not_pins() -> None:
    for group in [DEPENDENCIES, *EXTRAS.values()]:
        for name, req in group.items():
            assert req.specifier, f"{name} states no supported range"
            assert all(s.operator not in ("==", "===") for s in req.specifier), (
                f"{name}: exact pins belong in constraints.txt, not pyproject.toml")


def test_torch_range_spans_the_tested_releases_only() -> None:
    torch = DEPENDENCIES["torch"].specifier
    assert all(torch.contains(v) for v in TESTED_TORCH)
    assert not torch.contains("2.10.0") and not torch.contains("2.15.0")


def test_the_zoo_is_an_extra() -> None:
    assert not ZOO & set(DEPENDENCIES)
    assert set(EXTRAS["zoo"]) == ZOO


def test_the_lock_pins_every_requirement_within_its_range() -> None:
    pins = _lock()
    for group in [DEPENDENCIES, *EXTRAS.values()]:
        for name, req in group.items():
            assert name in pins, f"constraints.txt has no pin for {name}"
            assert req.specifier.contains(pins[name], prereleases=True), (
                f"constraints.txt pins {name}=={pins[name]} outside pyproject's {req.specifier}")


def test_installed_dependencies_satisfy_the_ranges() -> None:
    for name, req in DEPENDENCIES.items():
        installed = metadata.version(name)
        assert req.specifier.contains(installed, prereleases=True), (name, installed)


# ------------------------------------------------------------- in the compatibility venv
COMPAT_DIR = os.environ.get("PROFILEDNN_COMPAT_DIR")
DIST_DIR = os.environ.get("PROFILEDNN_DIST_DIR")
compat_only = pytest.mark.skipif(
    not (COMPAT_DIR and DIST_DIR), reason="runs in `make compat` (the wheel beside an older torch)"
)


@compat_only
def test_installing_the_wheel_left_the_users_torch_untouched() -> None:
    before = json.loads((Path(COMPAT_DIR) / "torch-before.json").read_text())
    assert torch_identity() == before
    assert DEPENDENCIES["torch"].specifier.contains(before["version"])


@compat_only
def test_the_wheel_is_what_runs_here_without_the_zoo() -> None:
    import profilednn

    installed = Path(profilednn.__file__).resolve()
    assert ROOT / "src" not in installed.parents, "profilednn should come from the wheel"
    for name in ZOO:
        with pytest.raises(metadata.PackageNotFoundError):
            metadata.version(name)
    script = Path(sys.executable).with_name("profilednn")
    done = subprocess.run([str(script), "version"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and profilednn.__version__ in done.stdout, done.stderr
    check = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True,
                           timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr


@compat_only
def test_build_made_a_wheel_and_an_sdist_with_the_package_data() -> None:
    dist = Path(DIST_DIR)
    (wheel,) = dist.glob("profilednn-*.whl")
    (sdist,) = dist.glob("profilednn-*.tar.gz")
    with tarfile.open(sdist) as tf:
        in_sdist = {m.name.split("/", 1)[1] for m in tf.getmembers() if m.isfile() and "/" in m.name}
    assert {"pyproject.toml", "README.md", "src/profilednn/__init__.py"} <= in_sdist
    with zipfile.ZipFile(wheel) as zf:
        in_wheel = set(zf.namelist())
    # The wheel is built from the sdist: every package file of the one is in the other,
    # the data files (report CSS/JS, C kernels, TOML/JSON) included.
    packaged = {name.removeprefix("src/") for name in in_sdist
                if name.startswith("src/profilednn/") and "egg-info" not in name}
    assert packaged <= in_wheel, sorted(packaged - in_wheel)[:10]
    suffixes = {Path(name).suffix for name in packaged}
    shipped = {p.suffix for p in (ROOT / "src" / "profilednn").rglob("*") if p.is_file()}
    assert {".py", ".css", ".c", ".h"} & shipped <= suffixes

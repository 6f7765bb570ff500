"""The README's Python examples run as written: each ```python block is executed in a fresh
namespace inside a temporary directory (its ``runs/`` lands there)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", README.read_text(encoding="utf-8"), flags=re.M | re.S)


def test_the_readme_has_python_examples():
    assert BLOCKS, "README.md lost its ```python examples"


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_python_block_runs(code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "__readme__"}
    exec(compile(code, str(README), "exec"), namespace)  # noqa: S102 - the README is ours
    run = namespace.get("run")
    if run is not None:  # the capture example: a complete Run with its layers, under ./runs
        assert run.status == "complete"
        assert Path(run.path).resolve().parent == (tmp_path / "runs").resolve()
        assert run.table("layers").height > 0


def test_profile_is_the_capture_context_manager_and_the_package_stays_importable():
    import profilednn
    import profilednn.capture

    assert profilednn.profile is profilednn.capture.capture
    assert callable(profilednn.profile_builtin) and callable(profilednn.list_workloads)

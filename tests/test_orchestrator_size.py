"""Rooms a newcomer can read: no function in ``src/`` is longer than 80 lines (``ast``:
``end_lineno - lineno``), and at most 3 files in ``src/profilednn`` are longer than 500
lines (a longer file mixes concerns: split it by concern); the orchestrators (``optimize``'s engine and its stages, ``project``'s
projector and its stages, the capture session and its table builders) are named on their own."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "profilednn"
LIMIT = 80
FILE_LIMIT = 500  # lines in one file
LONG_FILES_ALLOWED = 3  # files over FILE_LIMIT
MODULES = [
    # optimize: settings and result types, reference arm, try a recipe, child-process A/B,
    # the search and its second pass, the final numerics and A/B, FLOPs, the orchestrator
    "optimization/settings.py", "optimization/results.py", "optimization/reference.py", "optimization/trial.py",
    "optimization/child_ab.py", "optimization/search.py", "optimization/final.py", "optimization/flops.py",
    "optimization/engine.py",
    # project: cases -> replay -> tables -> summary -> step model, and the orchestrator
    "projection/project_cases.py", "projection/project_replay.py", "projection/project_tables.py",
    "projection/project_summary.py", "projection/project_step.py", "projection/projector.py",
    # capture: the session and one function per table
    "capture/session.py", "capture/capture_tables.py",
]


def long_functions(path: Path, limit: int = LIMIT) -> list[str]:
    """``name: N lines`` for every function (methods and nested ones too) over ``limit``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [f"{node.name}: {node.end_lineno - node.lineno} lines" for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno > limit]


def long_files(root: Path, limit: int = FILE_LIMIT) -> dict[str, int]:
    """``{path: lines}`` for every Python file under ``root`` longer than ``limit`` lines."""
    counts = {str(p.relative_to(root)): len(p.read_text(encoding="utf-8").splitlines())
              for p in sorted(root.rglob("*.py"))}
    return {path: n for path, n in counts.items() if n > limit}


ALL_MODULES = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py"))


@pytest.mark.parametrize("module", MODULES)
def test_no_function_is_over_80_lines(module):
    assert long_functions(SRC / module) == []


def test_no_function_in_src_is_over_80_lines():
    assert set(MODULES) <= set(ALL_MODULES)
    assert {m: found for m in ALL_MODULES if (found := long_functions(SRC / m))} == {}


def test_the_check_sees_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT + 1))
    path = tmp_path / "long.py"
    path.write_text(f"def short():\n    pass\n\n\ndef long():\n{body}\n")
    assert long_functions(path) == [f"long: {LIMIT + 1} lines"]


def test_at_most_3_files_in_src_are_over_500_lines():
    found = long_files(SRC)
    assert len(found) <= LONG_FILES_ALLOWED, found


def test_the_check_sees_a_long_file(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "long.py").write_text("x = 1\n" * (FILE_LIMIT + 1))
    (tmp_path / "short.py").write_text("x = 1\n" * FILE_LIMIT)
    assert long_files(tmp_path) == {"pkg/long.py": FILE_LIMIT + 1}

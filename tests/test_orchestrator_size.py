"""Rooms a newcomer can read: no function in ``src/`` is longer than 80 lines (``ast``:
``end_lineno - lineno``); the orchestrators (``optimize``'s engine and its stages, ``project``'s
projector and its stages, the capture session and its table builders) are named on their own."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "profilednn"
LIMIT = 80
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

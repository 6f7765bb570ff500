"""Each job is a package with an ``api.py`` (what its CLI verbs call and ``profilednn``
exports) and a ``terminal.py`` (its printer); ``cli/`` parses options and calls them."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import profilednn

JOBS = ("capture", "verbose", "analysis", "report", "projection", "optimization", "memory", "distributed",
        "workloads")
PRINTERS = ("capture", "verbose", "report", "projection", "optimization", "memory", "distributed", "workloads")
# Shared leaves every layer may use (the Run and its table catalogue, errors, output checks,
# number formatting, the machine).
SHARED = {"run", "tables", "errors", "outputs", "topology", "formatting", "interrupts", "extras",
          "builtin_workloads", ""}
CLI = Path(profilednn.__file__).parent / "cli"


@pytest.mark.parametrize("job", JOBS)
def test_every_name_of_a_job_api_resolves(job: str) -> None:
    api = importlib.import_module(f"profilednn.{job}.api")
    assert api.__all__
    for name in api.__all__:
        assert getattr(api, name) is not None, f"profilednn.{job}.api.{name}"


@pytest.mark.parametrize("job", PRINTERS)
def test_every_job_has_a_terminal_printer(job: str) -> None:
    terminal = importlib.import_module(f"profilednn.{job}.terminal")
    printers = [name for name in terminal.__all__ if name.startswith("print_")]
    assert printers and all(callable(getattr(terminal, name)) for name in printers)


def test_profilednn_exports_come_from_the_job_apis() -> None:
    for name, module in profilednn._LAZY.items():
        parts = module.split(".")
        if parts[1] == "run":  # the Run itself
            continue
        assert parts[-1] == "api" and parts[1] in JOBS, (name, module)
    for name in profilednn.__all__:
        assert getattr(profilednn, name) is not None, name


def _cli_imports() -> list[tuple[str, str]]:
    """(verb module, imported module relative to profilednn) for every import in cli/verbs_*.py."""
    found = []
    for path in sorted(CLI.glob("verbs_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 2:
                found.append((path.stem, node.module or ""))
    return found


def test_cli_verbs_call_only_job_apis_and_printers() -> None:
    imports = _cli_imports()
    assert imports
    for verb_module, module in imports:
        parts = module.split(".")
        if parts[0] in SHARED:
            continue
        assert parts[0] in JOBS and parts[-1] in ("api", "terminal") and len(parts) == 2, (verb_module, module)


def test_cli_redefines_no_formatting_helper() -> None:
    for path in CLI.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert not names & {"_fmt", "_ms", "_pct", "_mib", "_json_out", "_finite", "_bar", "_progress_bar"}, path


def test_cli_source_lines_fit_in_120_columns() -> None:
    long = [f"{path.name}:{i}" for path in sorted(CLI.glob("*.py"))
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if len(line) > 120]
    assert not long, "wrap these lines (an option's help string splits into adjacent literals):\n" + "\n".join(long)

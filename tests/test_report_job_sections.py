"""Jobs contribute report sections through ``<job>.report.report_sections(run)``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from profilednn.report import job_sections as js
from profilednn.render.html import Section


def _write_pkg(root: Path, name: str, body: str) -> None:
    pkg = root / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "report.py").write_text(body)


def test_sections_come_from_present_jobs_and_missing_jobs_are_skipped(tmp_path, monkeypatch) -> None:
    _write_pkg(tmp_path, "jobok", "from profilednn.render.html import Section\n"
               "def report_sections(run):\n    return [Section('From job', f'<p>{run}</p>')]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(js, "JOB_REPORT_MODULES", ("jobmissing.report", "jobok.report"))
    sections = js.job_sections("RUN")
    assert [s.title for s in sections] == ["From job"]
    assert isinstance(sections[0], Section) and "RUN" in sections[0].html


def test_a_broken_job_module_is_not_hidden(tmp_path, monkeypatch) -> None:
    _write_pkg(tmp_path, "jobbroken", "import module_that_does_not_exist_anywhere\n"
               "def report_sections(run):\n    return []\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(js, "JOB_REPORT_MODULES", ("jobbroken.report",))
    with pytest.raises(ModuleNotFoundError, match="module_that_does_not_exist_anywhere"):
        js.job_sections("RUN")
    sys.modules.pop("jobbroken", None)

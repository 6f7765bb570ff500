"""The HTML report in a real headless Chromium: it loads with no console error, its
script runs (sortable tables), and a screenshot shows the charts."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from matplotlib import image as mpimg

from profilednn import report_compare, report_run

from runfactory import make_run

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
if CHROMIUM is None:
    pytest.skip(
        "Debian's chromium is not installed (`make test` installs it when run as root: "
        "apt-get install -y chromium)",
        allow_module_level=True,
    )

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--enable-logging=stderr", "--v=0",
]
CONSOLE = re.compile(r":CONSOLE(?:\(|:)\d+\)?\]\s*(.*)")


def chromium(page: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    cmd = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args, page.resolve().as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def console_messages(stderr: str) -> list[str]:
    return [m.group(1) for m in CONSOLE.finditer(stderr)]


def loaded_body(page: Path, tmp_path: Path) -> tuple[str, list[str]]:
    """The <body> tag after scripts ran, and what the page printed on its console."""
    done = chromium(page, tmp_path, "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    body = re.search(r"<body[^>]*>", done.stdout)
    assert body, done.stdout[:500]
    return body.group(0), console_messages(done.stderr)


def test_console_errors_are_detected(tmp_path):
    """The check below can fail: a page with a script error is caught."""
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><body><script>undefinedFunction();</script></body></html>")
    _, messages = loaded_body(bad, tmp_path)
    assert any("undefinedFunction" in m for m in messages)


def colour_pixels(png: np.ndarray, hex_colour: str, tol: float = 0.04) -> int:
    rgb = np.array([int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5)])
    return int((np.abs(png[..., :3] - rgb) < tol).all(axis=-1).sum())


def test_run_report_loads_clean_and_shows_charts(tmp_path):
    run = make_run(tmp_path / "runs", layout="nchw", reorder_scale=4.0, frozen_bn=True)
    page = report_run(run)
    html = page.read_text(encoding="utf-8")
    body, messages = loaded_body(page, tmp_path)
    assert messages == [], messages
    assert 'data-ready="1"' in body
    assert "data-js-error" not in body and "data-console-error" not in body
    n_tables = html.count('class="sortable"')
    assert n_tables > 5 and f'data-sortable-tables="{n_tables}"' in body
    assert 'data-charts="4"' in body

    shot = tmp_path / "report.png"
    done = chromium(page, tmp_path, f"--screenshot={shot}", "--window-size=1200,2000", "--hide-scrollbars")
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    png = mpimg.imread(shot)
    assert png.shape[0] >= 1900 and png.shape[1] >= 1150
    assert len(np.unique(png[..., :3].reshape(-1, 3), axis=0)) > 50  # not a blank page
    # chart bars in the palette: forward / oneDNN blue and backward / native orange
    assert colour_pixels(png, "#4C78A8") > 5000
    assert colour_pixels(png, "#F58518") > 5000


def test_compare_report_loads_clean(tmp_path):
    a = make_run(tmp_path / "runs", loss="focal", num_classes=91)
    b = make_run(tmp_path / "runs", loss="focal", num_classes=264)
    page = report_compare(a, b, tmp_path / "compare.html")
    body, messages = loaded_body(page, tmp_path)
    assert messages == [], messages
    assert 'data-ready="1"' in body and 'data-charts="4"' in body

"""Without the [zoo] extra (no torchvision, no scikit-learn) every verb that does not build a
zoo model works, and one that does says, in one line, which extra to install.

The extra is hidden by tests/nozoo/sitecustomize.py in child processes, so this runs in the
main environment; `make compat` runs it again where torchvision is really absent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).parent
FIXTURE_LOG = HERE / "fixtures" / "verbose" / "onednn_v3.6.log"

USER_SCRIPT = """
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                      nn.Flatten(), nn.Linear(8 * 8 * 8, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(2, 3, 8, 8), torch.tensor([0, 1])
for step in range(3):
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
"""

# One process runs the verbs in turn (torch is imported once), then reports exit codes and
# whether an optional package was imported after all.
DRIVER = """
import json, sys, time
from pathlib import Path
from profilednn.cli import run_cli

tmp = Path(sys.argv[1]); log = sys.argv[2]; script = str(tmp / "train.py")
codes, seconds = {}, {}

def newest(runs):
    return str(max(Path(runs).iterdir(), key=lambda p: p.stat().st_mtime))

def verb(name, *argv):
    start = time.perf_counter()
    codes[name] = run_cli([str(a) for a in argv])
    seconds[name] = round(time.perf_counter() - start, 1)

verb("parse", "parse", log, "-o", tmp / "prims.parquet")
verb("breakdown", "breakdown", log)
verb("profile_script", "profile", "--steps", "2", "--warmup", "1", "-o", tmp / "a",
     "--", sys.executable, script)
run_a = newest(tmp / "a")
verb("profile_small_cnn", "profile", "--model", "small_cnn", "--steps", "1", "--warmup", "1",
     "--batch-size", "2", "-o", tmp / "b")
run_b = newest(tmp / "b")
verb("report", "report", run_a)
verb("compare", "compare", run_a, run_b)
verb("project", "project", run_a)
verb("memory", "memory", run_b)
verb("launch", "launch", "--nproc-per-node", "1", "--", sys.executable, script)
verb("models", "models")
loaded = sorted({m.split(".")[0] for m in sys.modules} & {"torchvision", "sklearn"})
(tmp / "codes.json").write_text(json.dumps({"codes": codes, "seconds": seconds, "loaded": loaded}))
"""


def _env_without_zoo() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE / "nozoo"), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    return env


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=_env_without_zoo(), capture_output=True, text=True,
                          timeout=600)


def test_the_zoo_is_hidden_in_child_processes(tmp_path: Path) -> None:
    done = _run([sys.executable, "-c", "import torchvision"], tmp_path)
    assert done.returncode != 0 and "No module named 'torchvision'" in done.stderr


@pytest.mark.slow
def test_verbs_work_without_the_zoo(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(textwrap.dedent(USER_SCRIPT))
    done = _run([sys.executable, "-c", DRIVER, str(tmp_path), str(FIXTURE_LOG)], tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "codes.json").read_text())
    failed = {verb: code for verb, code in result["codes"].items() if code != 0}
    assert not failed, f"{failed}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    print("seconds per verb:", result["seconds"])
    assert result["loaded"] == []  # nothing imported an optional package


@pytest.mark.parametrize(
    "argv",
    [
        ["profile", "--model", "resnet50", "--steps", "1", "--warmup", "0"],
        ["profile", "--model", "retinanet_resnext50_fpn", "--steps", "1", "--warmup", "0"],
    ],
    ids=["resnet50", "retinanet"],
)
def test_a_zoo_workload_names_the_extra_in_one_line(tmp_path: Path, argv: list[str]) -> None:
    done = _run([sys.executable, "-m", "profilednn", *argv, "-o", str(tmp_path / "runs")], tmp_path)
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert "needs torchvision" in lines[0] and "pip install 'profilednn[zoo]'" in lines[0]
    assert "Traceback" not in done.stderr


def test_digits_name_the_extra_through_the_api(tmp_path: Path) -> None:
    code = ("from profilednn import MissingExtraError\n"
            "from profilednn.workloads.digits import load_digits_data\n"
            "try:\n    load_digits_data()\nexcept MissingExtraError as exc:\n    print(exc)\n")
    done = _run([sys.executable, "-c", code], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "needs scikit-learn" in done.stdout and "profilednn[zoo]" in done.stdout


def test_a_stray_module_level_import_still_becomes_one_line() -> None:
    from profilednn.extras import missing_extra_for

    stray = ModuleNotFoundError("No module named 'torchvision.ops'", name="torchvision.ops")
    assert "pip install 'profilednn[zoo]'" in (missing_extra_for(stray) or "")
    assert missing_extra_for(ModuleNotFoundError("No module named 'x'", name="x")) is None


def test_import_optional_lets_other_import_failures_through(monkeypatch) -> None:
    from profilednn import MissingExtraError
    from profilednn.extras import import_optional

    def broken(name: str, *args, **kwargs):
        raise ModuleNotFoundError("No module named 'PIL'", name="PIL")  # torchvision's own dep

    monkeypatch.setattr("importlib.import_module", broken)
    with pytest.raises(ModuleNotFoundError) as info:
        import_optional("torchvision.ops")
    assert not isinstance(info.value, MissingExtraError) and info.value.name == "PIL"
    with pytest.raises(ValueError):
        import_optional("numpy")


def test_optimize_recipes_and_pipeline_stages_load_without_the_zoo(tmp_path: Path) -> None:
    code = ("from profilednn.optimization import load_recipes\n"
            "from profilednn.memory.pipeline.stages import as_layer_sequence\n"
            "from profilednn.workloads import build_workload\n"
            "recipes = load_recipes()\n"
            "assert {'frozen_batchnorm', 'fused_loss'} <= set(recipes), sorted(recipes)\n"
            "wl = build_workload('small_cnn', batch_size=2)\n"
            "assert len(as_layer_sequence(wl.model)) > 3\n"
            "import sys; assert 'torchvision' not in sys.modules\n"
            "print('ok')\n")
    done = _run([sys.executable, "-c", code], tmp_path)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]

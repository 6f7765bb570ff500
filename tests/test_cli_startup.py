"""CLI start-up stays light: `profilednn --help` and `import profilednn` load no heavy
library (torch, matplotlib, polars, numpy); each verb imports what it needs when it runs.

Which modules a fresh interpreter ends up with is deterministic, unlike a wall time, so
this is the start-up test (benchmarks/bench_parse.py reports the seconds).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "torchvision", "matplotlib", "polars", "numpy", "pyarrow", "scipy", "pandas")

_PROBE = r"""
import contextlib, io, json, sys
HEAVY = {heavy!r}
{action}
print(json.dumps(sorted({{m.split(".")[0] for m in sys.modules}} & set(HEAVY))))
"""


def _heavy_after(action: str) -> list[str]:
    code = _PROBE.format(heavy=HEAVY, action=action)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_the_package_and_the_cli_loads_no_heavy_library():
    assert _heavy_after("import profilednn, profilednn.cli") == []


def test_help_loads_no_heavy_library_and_lists_the_verbs():
    action = (
        "from profilednn.cli import run_cli\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n"
        "    code = run_cli(['--help'])\n"
        "assert code == 0, code\n"
        "assert 'breakdown' in buf.getvalue() and 'profile' in buf.getvalue(), buf.getvalue()\n"
    )
    assert _heavy_after(action) == []


def test_breakdown_help_loads_no_heavy_library():
    action = (
        "from profilednn.cli import run_cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert run_cli(['breakdown', '--help']) == 0\n"
    )
    assert _heavy_after(action) == []


def test_lazy_exports_still_resolve():
    import profilednn

    assert profilednn.read_log.__module__ == "profilednn.verbose.reader"
    assert profilednn.Run.__name__ == "Run" and callable(profilednn.breakdown)


def test_breakdown_verb_needs_no_torch(tmp_path):
    log = tmp_path / "v.log"
    log.write_text(
        "onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef,src:f32::blocked:ab::f0 "
        "dst:f32::blocked:ba::f0,,,8x8,0.25\n"
    )
    action = (
        "from profilednn.cli import run_cli\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n"
        f"    assert run_cli(['breakdown', {str(log)!r}, '--csv']) == 0\n"
        "assert 'reorder' in buf.getvalue()\n"
    )
    loaded = _heavy_after(action)
    assert "torch" not in loaded and "matplotlib" not in loaded
    from profilednn.verbose.native_scan import kernel

    if kernel() is not None:  # the one-pass totals (verbose/totals.py) group in plain Python
        assert "polars" not in loaded and "numpy" not in loaded, loaded


def test_the_torch_free_workload_names_match_the_registry():
    from profilednn.builtin_workloads import BUILTIN_WORKLOADS
    from profilednn.workloads.zoo import list_workloads

    assert BUILTIN_WORKLOADS == tuple(spec.name for spec in list_workloads())


def test_an_unknown_model_is_refused_before_torch_is_imported():
    action = (
        "from profilednn.cli import run_cli\n"
        "err = io.StringIO()\n"
        "with contextlib.redirect_stderr(err):\n"
        "    code = run_cli(['profile', '--model', 'nosuchnet', '--steps', '1'])\n"
        "assert code == 1, code\n"
        "assert 'nosuchnet' in err.getvalue() and 'small_cnn' in err.getvalue(), err.getvalue()\n"
    )
    assert "torch" not in _heavy_after(action)


def test_a_run_builds_only_the_verb_it_names():
    from typer.testing import CliRunner

    from profilednn.cli import app
    from profilednn.cli.app import app_for

    only = app_for(["breakdown", "x.log"])
    assert [c.name for c in only.registered_commands] == ["breakdown"]
    assert len(app.registered_commands) > 10  # app itself keeps every verb
    assert app_for(["--help"]) is app and app_for([]) is app and app_for(["no-such-verb"]) is app
    runner = CliRunner()
    for argv in (["breakdown", "--help"], ["breakdown", "x.log", "--by", "nope"], ["breakdown"]):
        full, narrow = runner.invoke(app, argv), runner.invoke(only, argv)
        assert (narrow.exit_code, narrow.output) == (full.exit_code, full.output), argv


def test_an_arm_and_a_capture_load_no_library_the_users_script_does_not_ask_for():
    """Every optimize arm is a fresh process (``python -m profilednn.optimization.script``)
    and a script capture runs in the user's own: before the script runs they load torch,
    never torchvision (about a second at every arm's start, and a package the user's program
    may never import) nor ``torch._dynamo`` (the script's first optimizer loads it, as it
    would without ProfileDNN). An object of torchvision's is looked up only where the script
    has loaded it (``extras.loaded_attribute``)."""
    code = ("import json, sys\n"
            "import profilednn.optimization.script.arm, profilednn.capture.runners, profilednn.optimization.engine\n"
            "import profilednn.optimization.frozen_batchnorm as fb, profilednn.optimization.loss as fl\n"
            "from torch import nn\n"
            "facts = [fb.is_frozen_batchnorm(nn.BatchNorm2d(2)), fl.focal_loss_sites(nn.MSELoss())]\n"
            "print(json.dumps([sorted(m for m in sys.modules if m.split('.')[0] == 'torchvision' "
            "or m.startswith('torch._dynamo')), 'torch' in sys.modules, facts]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    loaded, has_torch, facts = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded == [] and has_torch
    assert facts == [False, []]


def test_torchvisions_objects_are_found_once_the_script_loaded_torchvision():
    from torch import nn
    from torchvision.ops import sigmoid_focal_loss
    from torchvision.ops.misc import FrozenBatchNorm2d

    from profilednn.extras import loaded_attribute
    from profilednn.optimization.frozen_batchnorm import is_frozen_batchnorm
    from profilednn.optimization.loss import focal_loss_sites, reference_focal_loss

    assert is_frozen_batchnorm(FrozenBatchNorm2d(4)) and not is_frozen_batchnorm(nn.BatchNorm2d(4))
    assert reference_focal_loss() is sigmoid_focal_loss
    holder = nn.Module()
    holder.focal = sigmoid_focal_loss
    assert focal_loss_sites(holder) == [(holder, "focal")]
    assert loaded_attribute("torchvision.ops.misc", "no_such_name") is None
    with pytest.raises(ValueError, match="optional packages"):
        loaded_attribute("json", "dumps")

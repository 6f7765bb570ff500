"""``profilednn optimize -- python train.py``: the recipes on the user's own, unmodified
script, and ``profilednn apply RUN -- python train.py`` to train with what was accepted.

- ``inject.py``: each recipe injected into the script's process (hooks and patches on the
  objects the script creates; never its source);
- ``arm.py`` (run as ``python -m profilednn.optimization.script``): one arm, a fresh
  process that trains the script for a bounded window and reports back as JSON;
- ``runner.py``: starts an arm and reads its result; ``facts.py``: what an arm saw;
- ``checks.py``: which recipe applies to the script, and the equivalent code edits;
- ``search.py``: the script's arms for the one search (``..search``): A B A B child
  processes judged by the built-in path's gates;
- ``job.py``: runs the search and keeps the Run;
- ``apply.py``: the whole script with the accepted recipes.
"""

from __future__ import annotations

from ..._lazy import lazy_getattr

__all__ = ["ScriptSettings", "accepted_plan", "apply_run", "optimize_script"]

# loaded on first use: an arm (``python -m profilednn.optimization.script``, in every arm of
# every search) imports the injection and the window only, not the search and its recipes
__getattr__ = lazy_getattr(__name__, {"ScriptSettings": ".search", "accepted_plan": ".apply",
                                      "apply_run": ".apply", "optimize_script": ".job"})

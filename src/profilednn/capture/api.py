"""The capture job's Python API: what ``profilednn profile`` / ``demo`` call, and what
``profilednn`` exports.

* :func:`profile` -- ``with profilednn.profile("runs", model=m, optimizer=opt) as cap:``
  around your own training loop (``cap.step(loss)`` ends each step); a Run is written;
* :func:`profile_builtin` -- a built-in workload (``profilednn profile --model``);
* :func:`profile_script` -- a Python script (``profilednn profile -- python train.py``).

``profile`` is :func:`profilednn.capture.capture` under the name the package can export
(``profilednn.capture`` is this package).
"""

from __future__ import annotations

from .runners import Capture, capture, profile_builtin, profile_script

profile = capture

__all__ = ["Capture", "capture", "profile", "profile_builtin", "profile_script"]

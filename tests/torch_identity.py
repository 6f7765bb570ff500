"""What identifies the installed torch, without importing it: version, location, and a
digest of its RECORD (every file pip wrote and its hash). Equal before and after an
install means that install left torch untouched.

`make compat` runs this file before installing the wheel (``> .venv-compat/torch-before.json``);
tests/test_packaging.py compares it with the torch found afterwards.
"""

from __future__ import annotations

import hashlib
import json
import os
from importlib import metadata


def torch_identity() -> dict[str, str]:
    dist = metadata.distribution("torch")
    record = dist.read_text("RECORD") or ""
    (record_path,) = [f.locate() for f in dist.files or [] if f.name == "RECORD"]
    return {
        "version": dist.version,
        "location": str(dist.locate_file("")),
        "record_sha256": hashlib.sha256(record.encode()).hexdigest(),
        "record_mtime_ns": str(os.stat(record_path).st_mtime_ns),  # a reinstall rewrites it
    }


if __name__ == "__main__":
    print(json.dumps(torch_identity()))

"""Print the distributions ProfileDNN needs that this Python lacks (or has too old), one
line, space-separated, as ``name==version`` from constraints.txt: what
``device_verify.sh`` installs from ``.whl/`` and ``device_wheels.sh`` downloads.
torch, torchvision and their CUDA companions are never listed: the host's own are used."""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

# what `import profilednn` and the verify checks need beyond torch/torchvision, and the
# oldest version the package works with (pyproject.toml's ranges)
NEEDS = {"polars": "2.0", "polars-runtime-32": "2.0", "pyarrow": "20", "numpy": "2.0", "rich": "13",
         "typer": "0.29", "click": "8.2", "matplotlib": "3.8", "psutil": "5.9", "tomli_w": "1.0"}
LOCK = Path(__file__).resolve().parent.parent / "constraints.txt"


def _key(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split("+")[0].split(".")[:3] if p.isdigit())


def pinned() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, ver = line.split("==", 1)
            pins[name.strip().lower().replace("_", "-")] = ver.strip()
    return pins


def missing() -> list[str]:
    pins, out = pinned(), []
    for name, oldest in NEEDS.items():
        try:
            have = version(name)
        except PackageNotFoundError:
            have = None
        if have is None or _key(have) < _key(oldest):
            out.append(f"{name}=={pins[name.lower().replace('_', '-')]}")
    return out


if __name__ == "__main__":
    print(" ".join(missing()))
    sys.exit(0)

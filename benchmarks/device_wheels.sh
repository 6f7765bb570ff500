#!/usr/bin/env bash
# Download into .whl/ (ignored by git) exactly the wheels the device machine lacks, for its
# Python (3.12, x86-64, manylinux), at constraints.txt's versions; device_verify.sh installs
# them there. Run here, where pip reaches the registry. PYTHON_VERSION overrides 3.12.
# Which packages: what benchmarks/device_needs.py lists for the device's known package set
# (polars and its runtime, tomli_w; typer and click when the host's are older than ours).
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER=${PYTHON_VERSION:-3.12}
WANT=${DEVICE_WHEELS:-"polars polars-runtime-32 tomli_w typer click"}
pins=""
for name in $WANT; do
  pin=$(grep -i -E "^${name//-/[-_]}==" constraints.txt | head -1)
  [ -n "$pin" ] || { echo "device_wheels: $name is not pinned in constraints.txt" >&2; exit 2; }
  pins="$pins $pin"
done
mkdir -p .whl
platforms=""
for n in 17 24 27 28 31 34; do platforms="$platforms --platform manylinux_2_${n}_x86_64"; done
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  $platforms --platform manylinux2014_x86_64 --platform any -d .whl $pins
ls -l .whl
du -sh .whl

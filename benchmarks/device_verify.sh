#!/usr/bin/env bash
# benchmarks/verify.py on a borrowed machine that has its own torch (the device machine:
# an H200 with 16 cores, torch 2.11, no registry), from a bare copy of this checkout.
#
#   benchmarks/device_wheels.sh            # here, once: the wheels that machine lacks, into .whl/
#   device run (carry .whl):  bash benchmarks/device_verify.sh
#
# What it does there: installs only the packages the host's python3 lacks, from .whl/ and
# into a folder of their own (--target), so the host's torch and everything else it has
# stay as they are (checked after the install); runs verify.py against its budget under a
# hard limit (9 minutes by default); leaves verify.json, verify.md and verify.log in $OUT
# (the device tool brings that folder back) or in verify-out/.
#
# Environment: PYTHON (default python3), OUT, VERIFY_BUDGET_S (default 480),
# VERIFY_LIMIT_S (default 540), VERIFY_SITE (default /tmp/profilednn-site).
# Extra arguments go to verify.py (e.g. --only peaks,offload_gpu, --quick).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-$PWD/verify-out}
SITE=${VERIFY_SITE:-/tmp/profilednn-site}
BUDGET=${VERIFY_BUDGET_S:-480}
LIMIT=${VERIFY_LIMIT_S:-540}
mkdir -p "$OUT"
log() { echo "device_verify: $*" | tee -a "$OUT/verify.log" >&2; }

torch_before=$("$PY" -c 'import torch; print(torch.__version__, torch.__file__)') \
  || { log "no torch in $PY: this launcher uses the host's own torch"; exit 2; }
missing=$("$PY" benchmarks/device_needs.py) || { log "cannot check the installed packages"; exit 2; }
if [ -n "$missing" ]; then
  wheels=()
  for pin in $missing; do  # name==version -> .whl/name_with_underscores-version-*.whl
    name=$(echo "${pin%%==*}" | tr 'A-Z-' 'a-z_'); ver=${pin##*==}
    found=$(ls .whl/"$name"-"$ver"-*.whl 2>/dev/null | head -1)
    [ -n "$found" ] || { log "missing $pin and no such wheel in .whl/ (run benchmarks/device_wheels.sh where pip reaches a registry)"; exit 2; }
    wheels+=("$found")
  done
  log "installing into $SITE: ${wheels[*]}"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "${wheels[@]}" \
    || { log "pip could not install the carried wheels"; exit 2; }
fi
export PYTHONPATH="$SITE:$PWD/src:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}"
torch_after=$("$PY" -c 'import torch; print(torch.__version__, torch.__file__)')
if [ "$torch_before" != "$torch_after" ]; then
  log "the host's torch changed ($torch_before -> $torch_after): stopping"
  exit 2
fi
still=$("$PY" benchmarks/device_needs.py)
[ -z "$still" ] || { log "still missing after the install: $still"; exit 2; }
log "torch $torch_after; budget ${BUDGET} s, hard limit ${LIMIT} s; results in $OUT"
PYTHONUNBUFFERED=1 timeout --signal=TERM --kill-after=15 "$LIMIT" \
  "$PY" benchmarks/verify.py --budget-s "$BUDGET" --out "$OUT" "$@"
rc=$?
[ $rc -eq 124 ] && log "verify.py ran past ${LIMIT} s and was stopped"
exit $rc

"""``python -m profilednn.optimization.script SPEC.json [RESULT.json]``: one arm (``arm.py``)."""

import sys

from .arm import main

sys.exit(main(sys.argv[1:]))

"""Run minGPT's ``projects/chargpt/chargpt.py`` unmodified, timing its steps from outside.

The chargpt preset of ``script_timed.py`` under its former command line: give the folder
that holds ``mingpt/`` and ``projects/`` (a checkout of karpathy/minGPT, not part of
ProfileDNN). The input text is generated (no download): a seeded stream of words.

    python chargpt_timed.py --mingpt /work/ext/minGPT --times out.json [--profiler-window 2:4]
        -- --trainer.max_iters=6 --trainer.batch_size=32

is ``script_timed.py --preset chargpt MINGPT/projects/chargpt/chargpt.py --times ...``.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import script_timed  # noqa: E402  (this folder, a script's sibling)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mingpt", required=True, help="folder holding mingpt/ and projects/chargpt/")
    args, rest = ap.parse_known_args()
    script = os.path.join(os.path.abspath(args.mingpt), "projects", "chargpt", "chargpt.py")
    script_timed.main(["--preset", "chargpt", script, *rest])


if __name__ == "__main__":
    main()

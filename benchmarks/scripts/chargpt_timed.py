"""Run minGPT's ``projects/chargpt/chargpt.py`` unmodified, timing its steps from outside.

The capture benchmark's script mode (``bench_capture_script.py``) starts this file plain,
under ``torch.profiler`` alone, or under ``profilednn profile --stop-after``. minGPT is not
part of ProfileDNN: give the folder that holds ``mingpt/`` and ``projects/`` (a checkout of
karpathy/minGPT). The input text is generated here (no download): a seeded stream of words.

    python chargpt_timed.py --mingpt /work/ext/minGPT --times out.json [--profiler-window 2:4]
        -- --trainer.max_iters=6 --trainer.batch_size=32

Each step's time is the interval between two consecutive ``optimizer.step()`` calls (a
global pre-hook, so the last measured step is timed even when ``--stop-after`` ends the
script in the post-hook); the times go to ``--times`` as JSON at exit.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import random
import runpy
import shutil
import sys
import tempfile
import time

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

WORDS = ("the king lord god love death night day heart blood crown sword fair sweet good "
         "noble grace honour time world life soul eyes hand man woman son father mother").split()


def write_text(path: str, chars: int = 200_000) -> None:
    """A seeded, Shakespeare-flavoured word stream: enough characters for chargpt's dataset."""
    rng = random.Random(0)
    out, n = [], 0
    while n < chars:
        line = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 10))).capitalize() + ",\n"
        out.append(line)
        n += len(line)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("O God, O God!\n" + "".join(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mingpt", required=True, help="folder holding mingpt/ and projects/chargpt/")
    ap.add_argument("--times", required=True, help="JSON file for the step-start times (s)")
    ap.add_argument("--profiler-window", default=None,
                    help="A:B: steps A..B-1 under torch.profiler alone (full capture's options)")
    args, rest = ap.parse_known_args()
    rest = [a for a in rest if a != "--"]
    script = os.path.join(os.path.abspath(args.mingpt), "projects", "chargpt", "chargpt.py")
    work = tempfile.mkdtemp(prefix="chargpt-")
    write_text(os.path.join(work, "input.txt"))
    starts: list[float] = []
    ends = [0]
    atexit.register(lambda: (_dump(args.times, starts), shutil.rmtree(work, ignore_errors=True)))
    prof_window = tuple(int(v) for v in args.profiler_window.split(":")) if args.profiler_window else None
    prof: list[torch.profiler.profile] = []

    def pre(opt: object, a: object, k: object) -> None:
        starts.append(time.perf_counter())

    def post(opt: object, a: object, k: object) -> None:
        ends[0] += 1
        if prof_window is None:
            return
        if ends[0] == prof_window[0]:
            prof.append(torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                               record_shapes=True, profile_memory=True))
            prof[0].start()
        elif ends[0] == prof_window[1] and prof:
            prof[0].stop()
            prof[0].events()  # what a capture reads back from it
            sys.exit(0)

    register_optimizer_step_pre_hook(pre)
    register_optimizer_step_post_hook(post)
    sys.path.insert(0, os.path.abspath(args.mingpt))
    os.chdir(work)
    sys.argv = [script, f"--system.work_dir='{work}/out'", *rest]
    runpy.run_path(script, run_name="__main__")


def _dump(path: str, starts: list[float]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({"step_starts_s": starts}, fh)


if __name__ == "__main__":
    main()

"""Run any training script unmodified, timing its steps from outside.

The capture benchmark's script mode (``bench_capture_script.py``) starts this file plain,
under ``torch.profiler`` alone, or under ``profilednn profile --stop-after``. The script
runs as ``__main__`` (``runpy``), its own code untouched; a ``--preset`` prepares what a
public script needs to run here offline (``script_presets.py``: chargpt's text, run_mae's
images and offline Hugging Face settings; nothing for the ImageNet example's ``--dummy``).

    python script_timed.py --times out.json [--profiler-window 2:5] [--stop-at 5]
        [--preset chargpt|imagenet|hf_trainer] SCRIPT -- SCRIPT_ARGS...

Each step's time is the interval between two consecutive ``optimizer.step()`` calls (a
global pre-hook, so the last measured step is timed even when ``--stop-after`` ends the
script in the post-hook); the times go to ``--times`` as JSON at exit. ``--profiler-window
A:B`` runs steps A+1..B (after the A-th ``optimizer.step()`` up to the B-th) under
``torch.profiler`` alone with full capture's options, then exits; ``--stop-at N`` exits
after the N-th ``optimizer.step()`` (a script with no iteration limit of its own).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import runpy
import shutil
import sys
import tempfile
import time

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_presets import PRESETS  # noqa: E402  (this folder, a script's sibling)


class StepTimer:
    """Global optimizer hooks: step-start times, an optional ``torch.profiler`` window and stop."""

    def __init__(self, profiler_window: tuple[int, int] | None, stop_at: int | None) -> None:
        self.starts: list[float] = []
        self.ended = 0
        self.window = profiler_window
        self.stop_at = stop_at
        self.prof: torch.profiler.profile | None = None

    def install(self) -> None:
        register_optimizer_step_pre_hook(self.pre)
        register_optimizer_step_post_hook(self.post)

    def pre(self, opt: object, a: object, k: object) -> None:
        self.starts.append(time.perf_counter())

    def post(self, opt: object, a: object, k: object) -> None:
        self.ended += 1
        if self.window is not None:
            if self.ended == self.window[0]:
                self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                                   record_shapes=True, profile_memory=True)
                self.prof.start()
            elif self.ended == self.window[1] and self.prof is not None:
                self.prof.stop()
                self.prof.events()  # what a capture reads back from it
                sys.exit(0)
        if self.stop_at is not None and self.ended >= self.stop_at:
            sys.exit(0)

    def dump(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump({"step_starts_s": self.starts}, fh)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("script", help="the training script, run unmodified as __main__")
    ap.add_argument("--times", required=True, help="JSON file for the step-start times (s)")
    ap.add_argument("--profiler-window", default=None,
                    help="A:B: steps A+1..B under torch.profiler alone (full capture's options), then exit")
    ap.add_argument("--stop-at", type=int, default=None, help="exit after the N-th optimizer.step()")
    ap.add_argument("--preset", choices=sorted(PRESETS), default=None,
                    help="prepare data and settings for a known public script")
    args, rest = ap.parse_known_args(argv)
    args.rest = [a for a in rest if a != "--"]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    script = os.path.abspath(args.script)
    work = tempfile.mkdtemp(prefix="script-timed-")
    window = tuple(int(v) for v in args.profiler_window.split(":")) if args.profiler_window else None
    timer = StepTimer(window, args.stop_at)  # type: ignore[arg-type]
    atexit.register(lambda: (timer.dump(args.times), shutil.rmtree(work, ignore_errors=True)))
    script_args = PRESETS[args.preset](script, work, args.rest) if args.preset else args.rest
    timer.install()
    sys.path.insert(0, os.path.dirname(script))
    os.chdir(work)
    sys.argv = [script, *script_args]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()

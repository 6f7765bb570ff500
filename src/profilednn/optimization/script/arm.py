"""One arm of ``optimize -- python train.py``, in a fresh process:
``python -m profilednn.optimization.script SPEC.json [RESULT.json]`` (``__main__.py`` calls
``main``, so the script's tracebacks show none of these frames).

The user's script runs unmodified as ``__main__`` under capture's observation layer
(``capture.hooks.Instrumentation``: each step ends at the first optimizer's ``step()``,
the loss is the scalar the script backpropagates) with the arm's recipes injected
(``inject.py``). Python's, NumPy's and torch's random generators are seeded alike in every
arm before the script starts, so the loss trajectories of two arms compare.

With a window (``warmup`` + ``steps`` optimizer steps) the arm writes RESULT (JSON: the
loss of every step, the times of the ``steps`` steps after the warm-up, what it saw of the
script, what each recipe did) as soon as the window's last step ends, and leaves at once
(``os._exit``): the script never trains to its end, and none of its clean-up code runs.
A script that ends, exits or raises before that writes RESULT with how it ended.
Without a window (``profilednn apply``) the script trains to its end with the recipes
injected and the arm exits with the script's exit code. Two measurements may ride along,
in steps no A/B times: ``profile_steps`` (the headroom: steps under ``torch.profiler``,
split by op family, ``StepProfiler``) and ``count_flops_at`` (one step's model FLOPs by
dtype, ``FlopStep``). Under a launcher (``scale -- script``) every rank runs an arm: a
``{rank}`` in RESULT becomes the rank's number (its facts say the process group's size),
and ``comm_steps`` profiles that many steps after the window for the compute vs
allreduce split (``CommProfiler``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import runpy
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from ...capture.hooks import Installed, Instrumentation
from ...capture.page_faults import FaultCounter
from ...capture.script_target import print_script_traceback, script_target, script_traceback
from ...errors import first_line
from ...interrupts import system_exit_code
from .inject import Injector


def seed_everything(seed: int) -> None:
    """Python's, NumPy's (when installed) and torch's generators, seeded alike in every arm."""
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np
    except ImportError:
        return
    np.random.seed(seed % 2**32)


def _write(path: str | None, result: dict[str, Any]) -> None:
    if not path:
        return
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, path)


class StepBoundaries(Installed):
    """One global module pre-hook, installed before the script runs, that tells ``on_call``
    of every module call (cheap: a flag test until a measurement is armed). Installed up
    front and never changed mid-run: a global hook added or removed between steps changes
    what a compiled model's guards saw and makes Dynamo trace it again (timm's ``train.py``
    with the torch_compile recipe: 900 ms of ``bytecode_tracing`` inside a profiled step)."""

    def __init__(self, on_call: Callable[[], None]) -> None:
        super().__init__()
        self._on_call = on_call

    def install(self, adopt: Callable[[list[Any]], None]) -> None:
        handle = torch.nn.modules.module.register_module_forward_pre_hook(lambda *_: self._on_call())
        self._handles.append(handle)
        adopt([handle])  # the Instrumentation's: torch.compile does not warn about it


class StepProfiler:
    """The headroom split of a script's steps: ``steps`` steps after the warm-up under
    ``torch.profiler`` (CPU), split by op family in this process (``op_families.py``).

    A step's ``profilednn::step`` region opens at the first module call or backward after an
    ``optimizer.step()`` ends and closes at the next such point: the optimizer's own
    ``Optimizer.step#...`` region (inside which its hooks run) then lies whole in one step, and
    the step is the script's: its data loading, forward, backward, update and zero_grad. The
    arm's window needs one step more than ``steps`` for the last region to close."""

    def __init__(self, warmup: int, steps: int) -> None:
        self.warmup, self.steps = warmup, steps
        self._prof: Any = None
        self._region: Any = None
        self._pending = False  # a step ended: the next module call or backward opens the next region
        self._regions = 0
        self.split: dict[str, Any] | None = None

    def step_end(self, done: int) -> None:
        """Called at the end of optimizer step ``done`` (1-based)."""
        from ...capture.stream import quiet_profiler_noise

        if done == self.warmup:
            self._prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            with quiet_profiler_noise():
                self._prof.start()
        self._pending = self._prof is not None

    def boundary(self) -> None:
        """The first module call or backward after a step ended: one region closes, the next opens."""
        if not self._pending or torch.compiler.is_compiling():
            return
        from ...capture.stream import quiet_profiler_noise
        from ..op_families import STEP_REGION

        self._pending = False
        if self._region is not None:
            self._region.__exit__(None, None, None)
            self._region = None
            self._regions += 1
        if self._regions < self.steps:
            self._region = torch.profiler.record_function(STEP_REGION)
            self._region.__enter__()
            return
        with quiet_profiler_noise():
            self._prof.stop()
        self.split = self._families(self._prof)
        self._prof = None

    @staticmethod
    def _families(prof: Any) -> dict[str, Any]:
        from ..headroom import events_frame
        from ..op_families import family_split

        families, step_ms, n = family_split(events_frame(prof))
        return {"families": families.to_dicts(), "step_ms": step_ms, "steps": n}


class CommProfiler:
    """Compute vs communication of a data-parallel script (``capture.comm_split``): the
    ``steps`` steps after the timed window under ``torch.profiler`` (CPU), one step more so
    that the last one measured closes before the profiler stops. Those steps are never timed."""

    def __init__(self, after: int, steps: int) -> None:
        self.after, self.steps = after, steps
        self._prof: Any = None
        self.split: dict[str, Any] | None = None

    @property
    def last_step(self) -> int:
        return self.after + self.steps + 1

    def step_end(self, done: int) -> None:
        """Called at the end of optimizer step ``done`` (1-based)."""
        from ...capture.stream import quiet_profiler_noise

        if done == self.after:
            self._prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            with quiet_profiler_noise():
                self._prof.start()
        elif done == self.last_step and self._prof is not None:
            from ...capture.comm_split import comm_split, spans_of

            with quiet_profiler_noise():
                self._prof.stop()
            found = comm_split(spans_of(self._prof), max_steps=self.steps)
            self.split = found.to_dict() if found is not None else None
            self._prof = None


def parameter_digest(modules: list[torch.nn.Module]) -> str:
    """A digest of the modules' parameters, bit for bit: data-parallel ranks in sync hold
    the same one."""
    digest = hashlib.sha1()
    seen: set[int] = set()
    for module in modules:
        for p in module.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                digest.update(p.detach().reshape(-1).view(torch.uint8).cpu().numpy().tobytes())
    return digest.hexdigest()


class FlopStep:
    """The model FLOPs, by compute dtype, of step ``at`` (1-based) of the script: counted by
    ``flops.DtypeFlopCounter`` (``torch.utils.flop_counter``'s formulas) from the step's first
    module call or backward (after step ``at - 1`` ended; from the script's start for step 1)
    to its ``optimizer.step()``. The dispatch mode changes no value, and the step is not a
    timed one; a compiled model's calls are counted through it too."""

    def __init__(self, at: int) -> None:
        self.at = at
        self._armed = at == 1
        self._counter: Any = None
        self.flops: dict[str, float] | None = None

    def boundary(self) -> None:
        if not self._armed or torch.compiler.is_compiling():
            return
        from ..flops import DtypeFlopCounter

        self._armed = False
        self._counter = DtypeFlopCounter()
        self._counter.__enter__()

    def step_end(self, done: int) -> None:
        if done == self.at - 1:
            self._armed = True
        elif done == self.at and self._counter is not None:
            self._counter.__exit__(None, None, None)
            self.flops = {d: f for d, f in sorted(self._counter.flops.items()) if f > 0}
            self._counter = None


class Recorder:
    """Losses and step ends as the script trains; ends the arm when the window is full."""

    def __init__(self, spec: dict[str, Any], injector: Injector, result_path: str | None) -> None:
        self.warmup = int(spec.get("warmup", 1))
        self.steps = int(spec.get("steps", 0))
        comm_steps = int(spec.get("comm_steps") or 0)  # a launched job's: the compute vs allreduce split
        self.comm = CommProfiler(self.warmup + self.steps, comm_steps) if comm_steps else None
        window = self.comm.last_step if self.comm else self.warmup + self.steps
        self.window = window if spec.get("window", True) else None
        self.digest = bool(spec.get("param_digest"))  # a launched arm's: are the ranks still in sync?
        self.injector = injector
        self.result_path = result_path
        self.losses: list[float] = []
        self.ends: list[float] = []
        self._pending: list[float] = []
        self.started = time.perf_counter()
        self.faults = FaultCounter()  # the process's minor page faults, step by step
        profile_steps = int(spec.get("profile_steps") or 0)  # the headroom arm's: its steps under the profiler
        self.profiler = StepProfiler(self.warmup, profile_steps) if profile_steps else None
        flops_at = int(spec.get("count_flops_at") or 0)  # the step whose model FLOPs are counted
        self.flop_step = FlopStep(flops_at) if flops_at else None
        self.boundaries = StepBoundaries(self.boundary) if profile_steps or flops_at else None

    def boundary(self) -> None:
        """A module call or backward: where the measurements riding along open and close."""
        for watcher in (self.profiler, self.flop_step):  # the profiler stops before the counter starts
            if watcher is not None:
                watcher.boundary()

    def backward(self, tensors: Any) -> None:
        self.boundary()
        if isinstance(tensors, torch.Tensor) and tensors.numel() == 1:
            self._pending.append(float(tensors.detach().float()))

    def step_end(self) -> None:
        self.ends.append(time.perf_counter())
        self.faults.step_end()
        self.losses.append(sum(self._pending) if self._pending else math.nan)
        self._pending.clear()
        for watcher in (self.profiler, self.flop_step, self.comm):
            if watcher is not None:
                watcher.step_end(len(self.ends))
        if self.window is not None and len(self.ends) >= self.window:
            digest = {"param_digest": parameter_digest(self.injector.root_modules())} if self.digest else {}
            _write(self.result_path, self.result("window", **digest))
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)  # the window is measured: leave without running the rest of the script

    def result(self, status: str, **extra: Any) -> dict[str, Any]:
        ends = [self.started, *self.ends]
        durations = [(b - a) * 1000.0 for a, b in zip(ends, ends[1:])]
        return {
            "status": status,
            "steps_done": len(self.ends),
            "losses": self.losses,
            "first_step_ms": durations[0] if durations else None,
            "times_ms": durations[self.warmup:self.warmup + self.steps] if self.comm else durations[self.warmup:],
            "step_ms": durations,
            "faults_per_step": self.faults.per_step()[self.warmup:],  # the timed steps'
            "facts": self.injector.facts.to_dict(),
            "applied": dict(self.injector.applied),
            "dropout_sites": [site.to_dict() for site in self.injector.dropout_sites],
            "threads": torch.get_num_threads(),
            **({"headroom": self.profiler.split} if self.profiler is not None and self.profiler.split else {}),
            **({"flops_by_dtype": self.flop_step.flops} if self.flop_step is not None and self.flop_step.flops
               else {}),
            **({"comm": self.comm.split} if self.comm is not None and self.comm.split else {}),
            **extra,
        }



def run_arm(spec: dict[str, Any], result_path: str | None) -> int:
    """Run the script of ``spec`` as one arm; the exit code the arm process ends with."""
    path, module, args = script_target(list(spec["argv"]))
    if spec.get("threads") and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(int(spec["threads"]))
    injector = Injector(spec.get("recipes") or (), spec.get("options") or {}, spec.get("perturb"),
                        int(spec.get("seed") or 0))
    recorder = Recorder(spec, injector, result_path)
    inst = Instrumentation(on_step_end=recorder.step_end, on_backward=recorder.backward)
    sys.argv = [str(path) if path else str(module), *args]
    if path:
        sys.path.insert(0, str(path.resolve().parent))
    if spec.get("seed") is not None:  # every arm alike; ``apply`` leaves the script's randomness alone
        seed_everything(int(spec["seed"]))
    undo: list[Callable[[], None]] = []
    if spec.get("observe", True):
        inst.install()
        injector.install()
        inst.adopt(injector.module_hooks)
        undo += [injector.remove, inst.remove]
        if recorder.boundaries is not None:
            recorder.boundaries.install(inst.adopt)
            undo.append(recorder.boundaries.remove)
    else:  # the plain run the benchmark holds the observed one against: step ends only, no loss
        from torch.optim.optimizer import register_optimizer_step_post_hook

        undo.append(register_optimizer_step_post_hook(lambda *_: recorder.step_end()).remove)
    code = 0
    try:
        if path:
            runpy.run_path(str(path), run_name="__main__")
        else:
            runpy.run_module(str(module), run_name="__main__", alter_sys=True)
        result = recorder.result("ended", exit_code=0)
    except SystemExit as exc:
        code = system_exit_code(exc)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
        result = recorder.result("ended", exit_code=code, error=f"sys.exit({exc.code!r})")
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # the script's own error: this arm's verdict
        print_script_traceback(exc)
        code = 1
        result = recorder.result("error", exit_code=1, error=first_line(exc).rstrip(":"),
                                 traceback=script_traceback(exc)[-4000:])
    finally:
        for step in undo:
            step()
    if inst.fault:
        result["instrumentation_error"] = inst.fault.strip().splitlines()[-1]
    _write(result_path, result)
    return code


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print("usage: python -m profilednn.optimization.script SPEC.json [RESULT.json]", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())
    return run_arm(spec, rank_result_path(argv[1]) if len(argv) == 2 else None)


def rank_result_path(path: str) -> str:
    """RESULT with ``{rank}`` replaced by this process's global rank (torchrun's ``RANK``,
    0 without one): every rank of a launched arm writes a file of its own."""
    return path.replace("{rank}", os.environ.get("RANK", "0")) if "{rank}" in path else path



__all__ = ["Recorder", "main", "run_arm", "seed_everything"]

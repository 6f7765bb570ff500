"""Pipeline schedules in one process: stages on different devices (``cuda:0`` and ``cpu``,
or ``cpu`` twice), one worker thread per stage, micro-batches flowing between them.

Every stage runs a fixed list of operations, F(m) (forward of micro-batch m) and B(m)
(its backward); activations go down and gradients come back through FIFO queues. Because
each stage's list is fixed and each operation depends only on its inputs and on the
stage's own weights, the numbers do not depend on thread timing: a run is deterministic.

- ``gpipe`` (synchronous): all forwards, then all backwards; gradients accumulate over
  the micro-batches and each stage steps its optimizer once at the end (a flush). Same
  gradients as the whole batch at once.
- ``1f1b`` (synchronous): stage s runs ``S - s - 1`` warm-up forwards, then alternates one
  forward and one backward, then drains; same gradients as gpipe, fewer activations in
  flight (at most ``S - s`` micro-batches per stage instead of all of them).
- ``async`` (PipeDream-style, no flush): the 1F1B order, but every micro-batch is an
  update: each stage steps its optimizer after each backward. A stage's forward uses its
  newest weights; with *weight stashing* (the default) the backward of micro-batch m uses
  the weight version that m's forward used (kept as a copy while m is in flight), so each
  gradient is a true gradient of that version, applied to the newest weights. Without
  stashing (``stash=False``) the backward recomputes the forward with the newest weights
  (the naive scheme PipeDream fixes); the gradients then mix versions. Optional *weight
  averaging* keeps a running average of each stage's weights
  (``torch.optim.swa_utils.AveragedModel``) for evaluation.

Why not ``torch.distributed.pipelining``: it runs one stage per process with a process
group, which fits several CPU processes (``distributed.run_multiprocess``) but not a GPU
stage and a CPU stage in one process, and its schedules are synchronous only.
"""

from __future__ import annotations

import copy
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from ...errors import InputError

SCHEDULES = ("gpipe", "1f1b", "async")
Op = tuple[str, int]  # ("F" | "B", micro-batch index)


def stage_ops(schedule: str, stage: int, n_stages: int, n_micro: int) -> list[Op]:
    """The operations stage ``stage`` runs, in order."""
    if schedule not in SCHEDULES:
        raise InputError(f"unknown schedule {schedule!r}; choose {', '.join(SCHEDULES)}")
    if schedule == "gpipe":
        return [("F", m) for m in range(n_micro)] + [("B", m) for m in range(n_micro)]
    warm = min(n_stages - stage - 1, n_micro)
    ops: list[Op] = [("F", m) for m in range(warm)]
    for i in range(n_micro - warm):
        ops += [("F", warm + i), ("B", i)]
    ops += [("B", m) for m in range(n_micro - warm, n_micro)]
    return ops


@dataclass
class _InFlight:
    x: torch.Tensor
    out: torch.Tensor | None
    params: list[torch.Tensor] | None
    version: int
    target: torch.Tensor | None = None


@dataclass
class StageState:
    """One stage: its layers on its device, its optimizer, its weight version."""

    index: int
    device: torch.device
    module: nn.Module
    optimizer: torch.optim.Optimizer
    averaged: Any = None
    version: int = 0
    busy_ms: float = 0.0
    max_in_flight: int = 0
    max_versions: int = 0
    in_flight: dict[int, _InFlight] = field(default_factory=dict)
    writes_input: bool = False  # the first layer works in place (a ReLU(inplace=True))
    _snapshot: tuple[int, list[torch.Tensor]] | None = None

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.module.named_parameters()]

    def live_params(self) -> list[torch.Tensor]:
        return [p for _, p in self.module.named_parameters()]

    def snapshot(self) -> list[torch.Tensor]:
        """Leaf copies of the current weights (one copy per version, shared by the
        micro-batches whose forward ran at that version)."""
        if self._snapshot is None or self._snapshot[0] != self.version:
            self._snapshot = (self.version, [p.detach().clone().requires_grad_(p.requires_grad)
                                             for p in self.live_params()])
        return self._snapshot[1]


@dataclass
class ScheduleResult:
    """Losses per micro-batch and each stage's busy time, wall time and high-water marks."""

    losses: list[float]
    wall_ms: float
    busy_ms: list[float]
    max_in_flight: list[int]
    max_versions: list[int]

    @property
    def loss(self) -> float:
        return sum(self.losses) / max(1, len(self.losses))


class PipelineTrainer:
    """Train layer stages with a schedule; see the module docstring.

    ``stages``: one module per stage (moved to its device here); ``make_optimizer``: called
    with each stage's module; ``loss_fn(outputs, targets)`` on the last stage.
    """

    def __init__(
        self,
        stages: Sequence[nn.Module],
        devices: Sequence[torch.device],
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        make_optimizer: Callable[[nn.Module], torch.optim.Optimizer],
        schedule: str = "1f1b",
        stash: bool = True,
        average: bool = False,
        threads: bool = True,
    ) -> None:
        if schedule not in SCHEDULES:
            raise InputError(f"unknown schedule {schedule!r}; choose {', '.join(SCHEDULES)}")
        if len(stages) != len(devices) or len(stages) < 2:
            raise InputError(f"a pipeline needs >= 2 stages and one device per stage "
                             f"({len(stages)} stages, {len(devices)} devices)")
        self.schedule = schedule
        self.stash = stash
        self.threads = threads
        self.loss_fn = loss_fn
        self.stages: list[StageState] = []
        for i, (module, device) in enumerate(zip(stages, devices)):
            module.to(device)
            averaged = torch.optim.swa_utils.AveragedModel(module, use_buffers=True) if average else None
            first = next((m for m in module.modules() if not any(True for _ in m.children())), None)
            self.stages.append(StageState(i, torch.device(device), module, make_optimizer(module), averaged,
                                          writes_input=bool(getattr(first, "inplace", False))))

    # -- the model as a whole ---------------------------------------------------------------
    def forward(self, x: torch.Tensor, averaged: bool = False) -> torch.Tensor:
        """The whole model's forward (no schedule), e.g. for evaluation; ``averaged`` uses
        the averaged weights when weight averaging is on."""
        for st in self.stages:
            module = st.averaged.module if (averaged and st.averaged is not None) else st.module
            x = module(x.to(st.device))
        return x

    def train(self, mode: bool = True) -> None:
        for st in self.stages:
            st.module.train(mode)
            if st.averaged is not None:
                st.averaged.train(mode)

    # -- one run of the schedule over a list of micro-batches --------------------------------
    def run(self, micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> ScheduleResult:
        """Run the schedule over ``micro_batches``. Synchronous schedules step each
        optimizer once at the end (a flush); ``async`` steps after every micro-batch."""
        n_micro = len(micro_batches)
        if n_micro < 1:
            raise InputError("a pipeline run needs at least one micro-batch")
        n_stages = len(self.stages)
        total_items = sum(int(x.shape[0]) for x, _ in micro_batches)
        weights = [int(x.shape[0]) / total_items for x, _ in micro_batches]
        acts: list[queue.Queue[Any]] = [queue.Queue() for _ in range(n_stages)]
        grads: list[queue.Queue[Any]] = [queue.Queue() for _ in range(n_stages)]
        losses: dict[int, float] = {}
        for st in self.stages:
            st.in_flight.clear()
            st.busy_ms = 0.0
            st.max_in_flight = st.max_versions = 0
            if self.schedule != "async":
                st.optimizer.zero_grad(set_to_none=True)

        def do(st: StageState, op: Op) -> None:
            kind, m = op
            t0 = time.perf_counter()
            if kind == "F":
                self._forward(st, m, micro_batches, acts, weights, losses)
            else:
                self._backward(st, m, grads)
            st.busy_ms += (time.perf_counter() - t0) * 1000.0

        plans = [stage_ops(self.schedule, s, n_stages, n_micro) for s in range(n_stages)]
        t0 = time.perf_counter()
        if self.threads:
            self._run_threads(plans, do, acts, grads)
        else:
            self._run_round_robin(plans, do, acts, grads)
        wall_ms = (time.perf_counter() - t0) * 1000.0
        if self.schedule != "async":
            for st in self.stages:
                st.optimizer.step()
                st.version += 1
                if st.averaged is not None:
                    st.averaged.update_parameters(st.module)
        return ScheduleResult(
            losses=[losses[m] for m in range(n_micro)],
            wall_ms=wall_ms,
            busy_ms=[st.busy_ms for st in self.stages],
            max_in_flight=[st.max_in_flight for st in self.stages],
            max_versions=[st.max_versions for st in self.stages],
        )

    # -- operations -------------------------------------------------------------------------
    def _forward(self, st: StageState, m: int, micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
                 acts: list[queue.Queue[Any]], weights: list[float], losses: dict[int, float]) -> None:
        last = st.index == len(self.stages) - 1
        if st.index == 0:
            x = micro_batches[m][0].to(st.device, non_blocking=True)
        else:
            x = acts[st.index].get().to(st.device, non_blocking=True)
            x = x.detach().requires_grad_(x.is_floating_point())
        x_in = x.clone() if st.writes_input else x  # an in-place first layer must not write the leaf
        names = st.names
        if self.schedule == "async" and not self.stash:
            params = None  # the backward recomputes with whatever weights are newest then
            with torch.no_grad():
                out = st.module(x_in)
        else:
            params = st.snapshot() if self.schedule == "async" else st.live_params()
            out = functional_call(st.module, dict(zip(names, params)), (x_in,))
        target = None
        if last:
            target = micro_batches[m][1].to(st.device, non_blocking=True)
            loss = self.loss_fn(out, target)
            losses[m] = float(loss.detach())
            out = loss * (weights[m] if self.schedule != "async" else 1.0)
        else:
            acts[st.index + 1].put(out.detach())
        st.in_flight[m] = _InFlight(x=x, out=out if params is not None else None, params=params,
                                    version=st.version, target=target)
        st.max_in_flight = max(st.max_in_flight, len(st.in_flight))
        st.max_versions = max(st.max_versions, len({f.version for f in st.in_flight.values()}))

    def _backward(self, st: StageState, m: int, grads: list[queue.Queue[Any]]) -> None:
        last = st.index == len(self.stages) - 1
        flight = st.in_flight.pop(m)
        grad_out = None if last else grads[st.index].get().to(st.device, non_blocking=True)
        if flight.params is None:
            # No stashing: recompute the forward with the newest weights (and throw-away
            # buffers, so batch-norm statistics are not updated twice).
            params = [p.detach().clone().requires_grad_(p.requires_grad) for p in st.live_params()]
            state = {n: t for n, t in zip(st.names, params)}
            state.update({n: b.clone() for n, b in st.module.named_buffers()})
            out = functional_call(st.module, state, (flight.x.clone() if st.writes_input else flight.x,))
            if last:
                assert flight.target is not None
                out = self.loss_fn(out, flight.target)
        else:
            params, out = flight.params, flight.out
        assert out is not None
        inputs = [flight.x] if flight.x.requires_grad else []
        wanted = inputs + [p for p in params if p.requires_grad]
        got = torch.autograd.grad(out, wanted, grad_outputs=grad_out, allow_unused=True)
        if inputs:
            grads[st.index - 1].put(got[0])
        param_grads = iter(got[len(inputs):])
        for p in st.live_params():
            if not p.requires_grad:
                continue
            g = next(param_grads)
            if g is None:
                continue
            if self.schedule == "async":
                p.grad = g
            else:
                p.grad = g if p.grad is None else p.grad + g
        if self.schedule == "async":
            st.optimizer.step()
            st.optimizer.zero_grad(set_to_none=True)
            st.version += 1
            if st.averaged is not None:
                st.averaged.update_parameters(st.module)

    # -- executors -------------------------------------------------------------------------
    def _run_threads(self, plans: list[list[Op]], do: Callable[[StageState, Op], None],
                     acts: list[queue.Queue[Any]], grads: list[queue.Queue[Any]]) -> None:
        errors: list[BaseException] = []
        stop = threading.Event()

        def worker(st: StageState, plan: list[Op]) -> None:
            try:
                for op in plan:
                    if stop.is_set():
                        return
                    do(st, op)
            except BaseException as exc:  # handed to the caller below
                errors.append(exc)
                stop.set()
                for q in (*acts, *grads):  # wake every stage blocked on a queue
                    q.put(_Abort())

        workers = [threading.Thread(target=worker, args=(st, plan), name=f"pdnn-stage{st.index}", daemon=True)
                   for st, plan in zip(self.stages, plans)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        if errors:
            first = next((e for e in errors if not isinstance(e, _Aborted)), errors[0])
            raise first

    def _run_round_robin(self, plans: list[list[Op]], do: Callable[[StageState, Op], None],
                         acts: list[queue.Queue[Any]], grads: list[queue.Queue[Any]]) -> None:
        """One thread: run each stage's next operation when its input is ready."""
        cursor = [0] * len(plans)
        n_stages = len(plans)
        while any(c < len(p) for c, p in zip(cursor, plans)):
            progressed = False
            for s, plan in enumerate(plans):
                if cursor[s] >= len(plan):
                    continue
                kind, _ = plan[cursor[s]]
                needs = acts[s] if (kind == "F" and s > 0) else grads[s] if (kind == "B" and s < n_stages - 1) else None
                if needs is not None and needs.empty():
                    continue
                do(self.stages[s], plan[cursor[s]])
                cursor[s] += 1
                progressed = True
            if not progressed:
                raise RuntimeError("pipeline schedule deadlocked: no stage can run its next operation")


class _Aborted(RuntimeError):
    """A stage stopped because another stage failed."""


class _Abort:
    """Queue item that stops a stage waiting on it."""

    def to(self, *args: Any, **kwargs: Any) -> Any:
        raise _Aborted("stopped: another pipeline stage failed")


def copy_stages(stages: Sequence[nn.Module]) -> list[nn.Module]:
    """Deep copies (for a reference run on the same initial weights)."""
    return [copy.deepcopy(s) for s in stages]


__all__ = ["PipelineTrainer", "SCHEDULES", "ScheduleResult", "StageState", "copy_stages", "stage_ops"]

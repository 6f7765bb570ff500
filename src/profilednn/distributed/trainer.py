"""The built-in data-parallel trainer: a zoo model (or the digits MLP) under DDP.

Read top to bottom: join the process group (when started by torchrun with more than one
rank), build the model and this rank's slice of each global batch, resume from the last
checkpoint, train step by step with each phase timed, checkpoint every K steps, then
measure the allreduce cost and merge every rank's step table on rank 0.

Each rank writes its own Run under ``runs/<job>/`` (label ``rank<R>``; a restarted
attempt writes a new one). Tables: ``steps`` (the usual per-step table), ``dist_steps``
(compute vs communication per step) and, on rank 0, ``dist_rank_steps`` / ``dist_ranks``
(every rank, merged) and ``dist_comm`` (allreduce timings and the alpha-beta fit).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from ..errors import InputError, WorkloadError
from ..run import Run, create_run, finish_run
from ..tables import DIST_COMM, DIST_RANKS, DIST_RANK_STEPS, DIST_STEPS, STEPS
from ..train_step import TrainStep
from .backends import ENV_BACKEND
from .config import TrainConfig
from .checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from .comm import BucketTimer, fit_alpha_beta, measure_allreduce, timed_allreduce_hook
from .data import PoolBatches, TensorDatasetBatches
from .merge import merge_rank_steps

DIGITS = "digits"  # the MLP on scikit-learn's digits (real data, accuracy measurable)
ENV_FAULT = "PROFILEDNN_FAULT"  # "KIND:RANK:STEP", KIND exit|kill|hang; first attempt only
FAULT_EXIT_CODE = 13


@dataclass
class TrainResult:
    run: Run
    rank: int
    world_size: int
    start_step: int
    steps: int
    final_loss: float | None
    global_batch: int
    items_per_s: float | None
    checkpoint: Path | None = None
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int
    local_rank: int
    node_rank: int
    attempt: int  # torchrun's restart count


def rank_info() -> RankInfo:
    """Who this process is, from torchrun's environment (one process when unset)."""
    env = os.environ

    def num(name: str, default: int) -> int:
        value = env.get(name, "")
        return int(value) if value.strip().isdigit() else default

    return RankInfo(rank=num("RANK", 0), world_size=num("WORLD_SIZE", 1), local_rank=num("LOCAL_RANK", 0),
                    node_rank=num("GROUP_RANK", num("PROFILEDNN_NODE_RANK", 0)),
                    attempt=num("TORCHELASTIC_RESTART_COUNT", 0))


def init_distributed(backend: str | None = None, timeout_s: float | None = None) -> RankInfo:
    """Join the process group torchrun described (no-op for one process).

    ``backend`` defaults to what ``profilednn launch`` chose (gloo otherwise); ``timeout_s``
    bounds every collective, so a dead or hung peer ends this rank with an error.
    """
    info = rank_info()
    name = backend or os.environ.get(ENV_BACKEND) or "gloo"
    if info.world_size <= 1 and name != "mpi":
        return info
    if dist.is_initialized():
        return RankInfo(dist.get_rank(), dist.get_world_size(), info.local_rank, info.node_rank, info.attempt)
    timeout = float(timeout_s or os.environ.get("PROFILEDNN_PG_TIMEOUT") or 300.0)
    if name == "ccl":
        import importlib

        for module in ("oneccl_bindings_for_pytorch", "torch_ccl"):
            with contextlib.suppress(ImportError):
                importlib.import_module(module)
                break
    dist.init_process_group(backend=name, timeout=_dt.timedelta(seconds=timeout))
    return RankInfo(dist.get_rank(), dist.get_world_size(), info.local_rank, info.node_rank, info.attempt)


def maybe_inject_fault(spec: str | None, rank: int, step: int, attempt: int) -> None:
    """Fault injection for resilience tests: ``KIND:RANK:STEP`` on the first attempt only.

    ``exit`` ends the rank with code 13, ``kill`` sends it SIGKILL, ``hang`` blocks it
    forever (its peers then time out in the next allreduce).
    """
    if not spec or attempt != 0:
        return
    try:
        kind, want_rank, want_step = spec.split(":")
        hit = int(want_rank) == rank and int(want_step) == step
    except ValueError as exc:
        raise InputError(f"{ENV_FAULT} must look like exit:1:5 (KIND:RANK:STEP), not {spec!r}") from exc
    if not hit:
        return
    print(f"profilednn: injected fault {kind!r} on rank {rank} at step {step}", file=sys.stderr, flush=True)
    if kind == "exit":
        os._exit(FAULT_EXIT_CODE)
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "hang":
        while True:
            time.sleep(1.0)
    raise InputError(f"unknown fault kind {kind!r} in {ENV_FAULT}: use exit, kill or hang")


# --------------------------------------------------------------------------- model + data
RankBatches = PoolBatches | TensorDatasetBatches


def resolve_batches(cfg: TrainConfig, world: int) -> tuple[int, int]:
    """(local batch, global batch) from ``batch_size`` (per rank) or ``global_batch``."""
    if cfg.global_batch is not None:
        if cfg.global_batch < world or cfg.global_batch % world:
            raise WorkloadError(f"--global-batch {cfg.global_batch} must be a multiple of the "
                                f"{world} ranks")
        if cfg.batch_size is not None and cfg.batch_size * world != cfg.global_batch:
            raise WorkloadError(f"--batch-size {cfg.batch_size} x {world} ranks != --global-batch "
                                f"{cfg.global_batch}; give one of them")
        return cfg.global_batch // world, cfg.global_batch
    if cfg.batch_size is not None:
        if cfg.batch_size < 1:
            raise WorkloadError(f"--batch-size must be >= 1, not {cfg.batch_size}")
        return cfg.batch_size, cfg.batch_size * world
    local = 32 if cfg.model == DIGITS else None
    if local is None:
        from ..workloads import get_spec

        local = int(get_spec(cfg.model).defaults["batch_size"])
    return local, local * world


def build_rank_state(cfg: TrainConfig, rank: int, world: int, global_batch: int) -> tuple[TrainStep, RankBatches]:
    """The training state (model, optimizer, loss, the workload's config; no pool: each step
    is given its batch) and this rank's slice of each global batch, identical on every rank."""
    if cfg.model == DIGITS:
        from ..workloads.digits import digits_mlp, load_digits_data

        data = load_digits_data(seed=cfg.seed)
        model = digits_mlp(seed=cfg.seed)
        lr = 0.1 if cfg.lr is None else cfg.lr
        optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        config = {"name": DIGITS, "hidden": [128, 64], "lr": lr, "optimizer": "SGD",
                  "momentum": 0.9, "train_samples": int(len(data.y_train))}
        state = TrainStep(model, optimizer, nn.CrossEntropyLoss(), name=DIGITS, config=config)
        return state, TensorDatasetBatches(data.x_train, data.y_train, global_batch, rank, world, cfg.seed)
    from ..workloads import build_workload, get_spec

    knobs: dict[str, Any] = {}
    if cfg.lr is not None:
        if "lr" not in get_spec(cfg.model).knobs:
            raise WorkloadError(f"{cfg.model} takes no --lr")
        knobs["lr"] = cfg.lr
    state = build_workload(cfg.model, batch_size=global_batch, image_size=cfg.image_size, seq_len=cfg.seq_len,
                           num_classes=cfg.num_classes, channels_last=cfg.channels_last, dtype=cfg.dtype,
                           seed=cfg.seed, **knobs)
    data = PoolBatches.from_pool(list(state.batches), rank, world)
    state.batches = []  # the global pool is no longer needed; each rank keeps its slices
    return state, data


# --------------------------------------------------------------------------- training
def train(cfg: TrainConfig, progress: Callable[[int, int], None] | None = None) -> TrainResult:
    """Train ``cfg.model`` on this rank (all ranks call this); returns this rank's result."""
    if cfg.steps is None and cfg.epochs is None:
        raise InputError("give --steps N or --epochs E")
    if cfg.steps is not None and cfg.epochs is not None:
        raise InputError("give --steps or --epochs, not both")
    if (cfg.steps is not None and cfg.steps < 1) or (cfg.epochs is not None and cfg.epochs < 1):
        raise InputError("--steps/--epochs must be >= 1")
    if cfg.checkpoint_every < 1:
        raise InputError(f"--checkpoint-every must be >= 1, not {cfg.checkpoint_every}")
    if cfg.threads is not None:
        if cfg.threads < 1:
            raise InputError(f"--threads must be >= 1, not {cfg.threads}")
        torch.set_num_threads(cfg.threads)

    info = init_distributed(cfg.backend, cfg.pg_timeout)
    try:
        return _train(cfg, info, progress)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _job_id(cfg: TrainConfig) -> str:
    return (cfg.job_id or os.environ.get("PROFILEDNN_JOB_ID") or os.environ.get("TORCHELASTIC_RUN_ID")
            or f"train-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")


def _resume(cfg: TrainConfig, state: TrainStep, global_batch: int, notes: list[str]) -> tuple[int, str | None]:
    """Load the latest checkpoint of ``cfg.checkpoint_dir``, if any: the step to start at and its path."""
    ckpt = latest_checkpoint(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
    if ckpt is None:
        return 0, None
    saved = load_checkpoint(ckpt)
    if saved.get("model_name") != cfg.model or int(saved.get("global_batch", -1)) != global_batch:
        raise InputError(f"checkpoint {ckpt} is for {saved.get('model_name')} at global batch "
                         f"{saved.get('global_batch')}, not {cfg.model} at {global_batch}; use "
                         "another --checkpoint-dir")
    state.model.load_state_dict(saved["model"])
    state.optimizer.load_state_dict(saved["optimizer"])
    notes.append(f"resumed from {ckpt.name} at step {int(saved['step'])}")
    return int(saved["step"]), str(ckpt)


def _wrap_ddp(state: TrainStep, timer: BucketTimer, notes: list[str]) -> None:
    """DDP around the model, its allreduce timed per bucket."""
    model = state.model
    ddp = nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)
    ddp.register_comm_hook(timer, timed_allreduce_hook)
    state.model = ddp
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        notes.append("BatchNorm uses each rank's local batch statistics (SyncBatchNorm is "
                     "CUDA-only), so results differ slightly from one process on the global batch")


def _rank_run(cfg: TrainConfig, window: contextlib.ExitStack, job_dir: Path, rank: int, model: nn.Module,
              state: TrainStep, workload: dict[str, Any]) -> tuple[Run, Any]:
    """This rank's Run: a capture's (entered on ``window``) or a plain one; and the capture, if any."""
    if cfg.capture:
        from ..capture import capture

        cap = window.enter_context(capture(job_dir, model=model, optimizer=state.optimizer, warmup=cfg.warmup,
                                           steps=cfg.capture_steps, label=f"rank{rank}"))
        cap.run.update(workload=workload, command=cfg.command)
        return cap.run, cap
    from ..capture.fingerprint import fingerprint

    return create_run(job_dir, label=f"rank{rank}", command=cfg.command, workload=workload,
                      fingerprint=fingerprint()), None


def _measure_and_merge(run: Run, rows: list[dict[str, Any]], cfg: TrainConfig, rank: int, world: int,
                       global_batch: int) -> float | None:
    """After training: this rank's tables, the allreduce's alpha-beta, and on rank 0 the merged
    step table of every rank. The job's items/s (rank 0; None elsewhere)."""
    _write_rank_tables(run, rows, cfg, capture_owns_steps=cfg.capture)
    if world > 1 and cfg.measure_comm:
        comm = measure_allreduce()
        if rank == 0:
            ab = fit_alpha_beta(comm)
            run.write_table(DIST_COMM, comm)
            run.update(alpha_beta=ab.to_dict())
    everyone = _gather(rows, world)
    if rank != 0:
        return None
    merged = DIST_RANK_STEPS.frame([r for part in everyone for r in part])
    summary = merge_rank_steps(merged, warmup=cfg.warmup)
    run.write_table(DIST_RANK_STEPS, merged)
    run.write_table(DIST_RANKS, summary.per_rank)
    items_per_s = summary.items_per_s(global_batch)
    run.update(merged={"ranks": world, "stragglers": summary.stragglers,
                       "step_ms": summary.step_ms, "items_per_s": items_per_s})
    return items_per_s


def _train(cfg: TrainConfig, info: RankInfo, progress: Callable[[int, int], None] | None) -> TrainResult:
    rank, world = info.rank, info.world_size
    local_batch, global_batch = resolve_batches(cfg, world)
    state, data = build_rank_state(cfg, rank, world, global_batch)
    model = state.model
    total_steps = cfg.steps if cfg.steps is not None else int(cfg.epochs) * data.steps_per_epoch  # type: ignore[arg-type]
    notes: list[str] = []
    # Resume before wrapping: every rank loads the same state, so DDP's initial broadcast is a no-op.
    start_step, resumed_from = _resume(cfg, state, global_batch, notes)
    timer = BucketTimer(world_size=world)
    if world > 1:
        _wrap_ddp(state, timer, notes)

    job_dir = Path(cfg.runs_dir) / _job_id(cfg)
    distributed = {
        "job_id": job_dir.name, "rank": rank, "world_size": world, "local_rank": info.local_rank,
        "node_rank": info.node_rank, "attempt": info.attempt,
        "backend": (dist.get_backend() if dist.is_initialized() else None),
        "local_batch": local_batch, "global_batch": global_batch,
        "threads": torch.get_num_threads(),
        "cpus": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "start_step": start_step, "resumed_from": resumed_from, "total_steps": total_steps,
        "steps_per_epoch": data.steps_per_epoch,
    }
    workload = {"kind": "builtin", "name": cfg.model, "config": state.config, "items_per_batch": local_batch}

    with contextlib.ExitStack() as window:
        run, cap = _rank_run(cfg, window, job_dir, rank, model, state, workload)
        run.update(distributed=distributed, notes=list(run.manifest.get("notes") or []) + notes)

        rows: list[dict[str, Any]] = []
        fault = os.environ.get(ENV_FAULT)
        last_ckpt: Path | None = None
        try:
            for step in range(start_step, total_steps):
                maybe_inject_fault(fault, rank, step, info.attempt)
                rows.append(_one_step(state, data, timer, step, rank, cap))
                done = step + 1
                if cap is not None and done - start_step >= cfg.warmup + cfg.capture_steps:
                    window.close()  # the profiled window is over; train on unobserved
                    cap = None
                    run.set_status("running")
                if cfg.checkpoint_dir and (done % cfg.checkpoint_every == 0 or done == total_steps):
                    if rank == 0:
                        last_ckpt = save_checkpoint(cfg.checkpoint_dir, done, {
                            "model": model.state_dict(), "optimizer": state.optimizer.state_dict(),
                            "model_name": cfg.model, "global_batch": global_batch, "seed": cfg.seed,
                        })
                    _write_rank_tables(run, rows, cfg, capture_owns_steps=cfg.capture)
                if progress is not None:
                    progress(done, total_steps)
        except BaseException as exc:
            _write_rank_tables(run, rows, cfg, capture_owns_steps=cfg.capture)
            finish_run(run, exc)  # failed, or interrupted on Ctrl-C / SIGTERM
            raise
        window.close()
        if run.recorded_status == "complete":  # the capture window ended with the last step;
            run.set_status("running")          # the measurement and the merge below still decide

    with run:  # the measurement and the merge: a failure here still ends the Run (failed / interrupted)
        items_per_s = _measure_and_merge(run, rows, cfg, rank, world, global_batch)
        final_loss = rows[-1]["loss"] if rows else None
        run.set_status("complete", steps=len(rows), final_step=total_steps)
    return TrainResult(run=run, rank=rank, world_size=world, start_step=start_step, steps=total_steps,
                       final_loss=final_loss, global_batch=global_batch, items_per_s=items_per_s,
                       checkpoint=last_ckpt, notes=notes)


def _one_step(state: TrainStep, data: RankBatches, timer: BucketTimer, step: int, rank: int,
              cap: Any) -> dict[str, Any]:
    """One timed ``TrainStep``: zero_grad and the optimizer, data, forward + loss, backward
    (with allreduce); the capture, when on, marks the data and loss phases."""
    timer.reset()
    result = state.run(lambda: data.batch(step), phase=cap.phase if cap is not None else None)
    if cap is not None:
        cap.step(result.loss)
    m = result.marks
    comm_s = timer.busy_s()
    # Communication nobody computed under: from the last bucket's launch to backward's end.
    exposed_s = max(0.0, m.backward - max(timer.last_start, m.loss)) if timer.last_start is not None else 0.0
    phases = m.phase_ms()
    return {
        "rank": rank, "step": step, "time_ms": m.total_ms, "loss": result.loss,
        "data_ms": phases["data_ms"], "forward_ms": phases["forward_ms"] + phases["loss_ms"],
        "backward_ms": phases["backward_ms"], "optimizer_ms": phases["optimizer_ms"],
        "allreduce_ms": comm_s * 1e3, "exposed_comm_ms": exposed_s * 1e3,
        "compute_ms": m.total_ms - phases["data_ms"] - exposed_s * 1e3, "buckets": len(timer.intervals),
        "allreduce_bytes": timer.nbytes,
    }


def _write_rank_tables(run: Run, rows: list[dict[str, Any]], cfg: TrainConfig, *, capture_owns_steps: bool) -> None:
    if not rows:
        return
    df = DIST_STEPS.frame(rows)
    run.write_table(DIST_STEPS, df)
    if not capture_owns_steps:  # forward_ms holds forward and loss; allocations are not counted
        steps = STEPS.frame([{**row, "loss_ms": 0.0, "other_ms": 0.0} for row in rows])
        run.write_table(STEPS, steps)
        run.update(steps=df.height)


def _gather(rows: list[dict[str, Any]], world: int) -> list[list[dict[str, Any]]]:
    if world <= 1 or not dist.is_initialized():
        return [rows]
    out: list[Any] = [None] * world if dist.get_rank() == 0 else []
    dist.gather_object(rows, out if dist.get_rank() == 0 else None, dst=0)
    return out if dist.get_rank() == 0 else []


__all__ = ["DIGITS", "ENV_FAULT", "RankInfo", "TrainConfig", "TrainResult", "init_distributed", "rank_info", "train"]

"""Synchronous pipeline schedules over several CPU processes, on
``torch.distributed.pipelining`` (one stage per process, gloo point-to-point).

This is where stock PyTorch's pipelining fits: every stage on a CPU, one process each, a
process group between them; ``ScheduleGPipe`` and ``Schedule1F1B`` run the micro-batches
(its schedules are synchronous only: ``async`` runs in one process, ``schedules``). The
parent process computes the balance, spawns the ranks, and collects each stage's losses,
busy time and final weights.
"""

from __future__ import annotations

import io
import os
import statistics
import time
from typing import Any

import torch

from ...distributed.launch import free_port
from ...errors import InputError, ProfileDNNError
from .tasks import build_task  # the same seeded task as in one process

MP_SCHEDULES = ("gpipe", "1f1b")


def _worker(rank: int, world: int, port: int, spec: dict[str, Any], out: Any) -> None:
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from .stages import split_layers

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(spec["threads_per_rank"])
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        task = build_task(spec)
        module = split_layers(task.layers.model, spec["balance"])[rank]
        optimizer = task.make_optimizer(module)
        stage = PipelineStage(module, rank, world, torch.device("cpu"))
        kind = ScheduleGPipe if spec["schedule"] == "gpipe" else Schedule1F1B
        sched = kind(stage, n_microbatches=spec["microbatches"], loss_fn=task.loss_fn)
        losses: list[float] = []
        wall: list[float] = []
        for x, y in task.batches:
            optimizer.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            if rank == 0:
                sched.step(x)
            elif rank == world - 1:
                micro: list[torch.Tensor] = []
                sched.step(target=y, losses=micro)
                losses.append(float(torch.stack([m.detach() for m in micro]).mean()))
            else:
                sched.step()
            optimizer.step()
            wall.append((time.perf_counter() - t0) * 1000.0)
        # Weights go back as bytes: a tensor sent through a queue is shared by a file
        # descriptor the parent must fetch from this process, which may have exited by then.
        buffer = io.BytesIO()
        torch.save(module.state_dict(), buffer)
        out.put((rank, {"losses": losses, "wall_ms": wall, "state": buffer.getvalue()}, None))
    except BaseException as exc:  # reported to the parent, which raises
        out.put((rank, None, f"{type(exc).__name__}: {exc}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_multiprocess(spec: dict[str, Any], n_stages: int, timeout_s: float = 600.0) -> dict[str, Any]:
    """Run ``spec`` (see ``tasks.build_task``; with ``balance``, ``schedule``,
    ``microbatches``) on ``n_stages`` CPU processes; returns losses, step times and the
    stages' final ``state_dict``s."""
    import queue as _queue

    import torch.multiprocessing as mp

    if spec["schedule"] not in MP_SCHEDULES:
        raise InputError(f"several processes run {', '.join(MP_SCHEDULES)} (torch.distributed.pipelining); "
                         f"{spec['schedule']!r} runs in one process")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    spec = {**spec, "threads_per_rank": max(1, cores // n_stages)}
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, n_stages, port, spec, out), daemon=True) for r in range(n_stages)]
    for p in procs:
        p.start()
    results: dict[int, dict[str, Any]] = {}
    errors: list[str] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(results) + len(errors) < n_stages:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ProfileDNNError(f"pipeline processes did not finish within {timeout_s:.0f} s")
            try:
                rank, payload, error = out.get(timeout=min(remaining, 5.0))
            except _queue.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise ProfileDNNError(f"a pipeline process exited with code {dead[0].exitcode}") from None
                continue
            if error is not None:
                errors.append(f"rank {rank}: {error}")
            else:
                results[rank] = payload
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
    if errors:
        raise ProfileDNNError("pipeline process failed: " + "; ".join(errors))
    last = results[n_stages - 1]
    wall = [max(results[r]["wall_ms"][i] for r in results) for i in range(len(last["wall_ms"]))]
    return {"losses": last["losses"], "wall_ms": wall, "median_step_ms": statistics.median(wall),
            "states": [torch.load(io.BytesIO(results[r]["state"]), weights_only=True) for r in range(n_stages)]}


__all__ = ["MP_SCHEDULES", "run_multiprocess"]

"""Capture overhead on users' stacks: a ``torch.compile`` loop and a Lightning Trainer.

Four modes run interleaved round by round in one process on the same model: ``plain``
(no observation), ``light`` (markers + oneDNN verbose), ``full`` (light + torch.profiler)
and ``profiler`` (``torch.profiler`` alone, with the options full capture uses). Every
step is timed the same way, with ``perf_counter`` around it (a Lightning callback for
the Trainer), and each captured round is a ``CaptureSession`` observing every step, as
``profilednn profile -- python train.py`` does. Used by ``bench_capture.py --stack``.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from typing import Callable

import torch
from torch import nn

from profilednn.capture.session import CaptureSession

MODES = ("plain", "light", "full", "profiler")


def _cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2), nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(64, 10),
    )


def _observe(mode: str, runs: str, run_steps: Callable[[], list[float]]) -> list[float]:
    """Run ``run_steps`` under ``mode``; return its per-step times (ms)."""
    if mode == "plain":
        return run_steps()
    if mode == "profiler":
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                      record_shapes=True, profile_memory=True)
        with prof:
            return run_steps()
    session = CaptureSession(runs, label=f"bench-{mode}", command=None, workload={"kind": "bench"},
                             warmup=0, steps=None, light=(mode == "light"), auto_steps=True,
                             window_from_start=True)
    session.start()
    try:
        return run_steps()
    finally:
        session.finish("complete")


def compiled_steps(batch: int, image: int, steps: int) -> Callable[[], list[float]]:
    torch.manual_seed(0)
    model = _cnn()
    cmodel = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(batch, 3, image, image), torch.randint(0, 10, (batch,))

    def run() -> list[float]:
        out = []
        for _ in range(steps):
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(cmodel(x), y).backward()
            opt.step()
            out.append((time.perf_counter() - t0) * 1000)
        return out

    return run


def lightning_steps(batch: int, image: int, steps: int) -> Callable[[], list[float]]:
    import pytorch_lightning as pl
    from torch.utils.data import DataLoader, TensorDataset

    class Net(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.body = _cnn()

        def training_step(self, b: tuple[torch.Tensor, torch.Tensor], i: int) -> torch.Tensor:
            return nn.functional.cross_entropy(self.body(b[0]), b[1])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)

    class Timer(pl.Callback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self._t0 = 0.0

        def on_train_batch_start(self, *a: object) -> None:
            self._t0 = time.perf_counter()

        def on_train_batch_end(self, *a: object) -> None:
            self.times.append((time.perf_counter() - self._t0) * 1000)

    torch.manual_seed(0)
    net = Net()
    data = TensorDataset(torch.randn(batch * steps, 3, image, image), torch.randint(0, 10, (batch * steps,)))

    def run() -> list[float]:
        timer = Timer()
        trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, callbacks=[timer])
        trainer.fit(net, DataLoader(data, batch_size=batch))
        return timer.times[1:]  # the first batch of a fit pays the Trainer's set-up

    return run


def bench_stack(stack: str, *, batch: int, image: int, rounds: int, steps: int,
                light_target_pct: float) -> bool:
    """Print the per-mode medians and ratios; True when light and full meet their targets."""
    import logging

    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    make = {"compiled": compiled_steps, "lightning": lightning_steps}[stack]
    run_steps = make(batch, image, steps)
    print(f"{stack}: CNN batch {batch} image {image}, threads {torch.get_num_threads()}, "
          f"{rounds} rounds x {steps} steps per mode, modes interleaved")
    run_steps()  # warm-up: compilation, primitive creation, allocator
    times: dict[str, list[float]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as runs:
        for r in range(rounds):
            for mode in MODES:
                times[mode].extend(_observe(mode, runs, run_steps))
            print(f"  round {r + 1}: " + ", ".join(
                f"{m} {statistics.median(v[-steps:]):.1f} ms" for m, v in times.items()))
    med = {m: statistics.median(v) for m, v in times.items()}
    print(f"\n{'mode':9} {'median ms':>10} {'min':>9} {'max':>9} {'vs plain':>9}")
    for m, v in times.items():
        print(f"{m:9} {med[m]:10.2f} {min(v):9.2f} {max(v):9.2f} {med[m] / med['plain']:8.3f}x")
    light_pct = (med["light"] / med["plain"] - 1) * 100
    full_vs_prof = (med["full"] / med["profiler"] - 1) * 100
    light_ok, full_ok = light_pct <= light_target_pct, full_vs_prof <= 0.0
    print(f"\n--light vs plain {light_pct:+.1f}% (target <= {light_target_pct:.0f}%: "
          f"{'met' if light_ok else 'MISSED'}); full vs torch.profiler alone {full_vs_prof:+.1f}% "
          f"(target <= 0%: {'met' if full_ok else 'MISSED'})")
    return light_ok and full_ok

"""One training step for every job: ``TrainStep`` orders zero_grad / data / forward / loss /
backward / update one way and reads the loss one way; each job's step is that step."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch import nn

from profilednn.memory.training import DeviceStep
from profilednn.optimization.setup import setup_from_workload
from profilednn.tables import PHASE_COLUMNS
from profilednn.train_step import TrainStep
from profilednn.workloads import build_workload

KNOBS = {"batch_size": 2, "image_size": 16, "seed": 0}


def _tiny() -> tuple[nn.Module, torch.optim.Optimizer, list[tuple[torch.Tensor, torch.Tensor]]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(4, 8, generator=gen), torch.randint(0, 3, (4,), generator=gen)) for _ in range(3)]
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), batches


def test_a_step_trains_exactly_like_the_plain_loop() -> None:
    model, opt, batches = _tiny()
    ref_model, ref_opt, _ = _tiny()
    step = TrainStep(model, opt, nn.CrossEntropyLoss(), batches)
    for i in range(5):
        got = step.run().loss
        x, y = batches[i % len(batches)]
        ref_opt.zero_grad(set_to_none=True)
        loss = nn.CrossEntropyLoss()(ref_model(x), y)
        loss.backward()
        ref_opt.step()
        assert got == float(loss.detach())
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ref_model.parameters()))


def test_hooks_see_the_phases_in_order() -> None:
    model, opt, batches = _tiny()
    seen: list[str] = []

    @contextlib.contextmanager
    def phase(name: str) -> Iterator[None]:
        seen.append(f"{name}:begin")
        yield
        seen.append(f"{name}:end")

    @contextlib.contextmanager
    def around() -> Iterator[None]:
        seen.append("around:begin")
        yield
        seen.append("around:end")

    def before_update() -> None:
        assert all(p.grad is not None for p in model.parameters())  # backward ran, update did not
        seen.append("before_update")

    result = TrainStep(model, opt, nn.CrossEntropyLoss()).run(
        lambda: (seen.append("batch") or batches[0]), phase=phase, around_forward=around(),
        before_update=before_update)
    assert seen == ["data:begin", "batch", "data:end", "around:begin", "loss:begin", "loss:end", "around:end",
                    "before_update"]
    marks = result.marks
    assert marks.start <= marks.zeroed <= marks.data <= marks.forward <= marks.loss <= marks.backward <= marks.end
    phases = marks.phase_ms()
    assert tuple(phases) == PHASE_COLUMNS
    assert abs(sum(phases.values()) - marks.total_ms) < 1e-6


def test_workload_optimize_and_memory_steps_are_the_same_step() -> None:
    """Three jobs, three entry points, one step: identical losses on identical weights."""
    plain = build_workload("small_cnn", **KNOBS)
    setup = setup_from_workload(build_workload("small_cnn", **KNOBS))
    assert [plain.train_step() for _ in range(3)] == [setup.step() for _ in range(3)]

    device = DeviceStep(build_workload("small_cnn", **KNOBS))
    fixed = build_workload("small_cnn", **KNOBS)
    first: Any = fixed.batches[0]
    assert [device.step() for _ in range(2)] == [fixed.as_train_step().run(first).loss for _ in range(2)]


def test_optimize_reads_gradients_between_backward_and_update() -> None:
    setup = setup_from_workload(build_workload("small_cnn", **KNOBS))
    before = {n: p.detach().clone() for n, p in setup.model.named_parameters()}
    grads: dict[str, torch.Tensor] = {}
    setup.step(grads_out=grads)
    assert set(grads) == set(before)
    for name, param in setup.model.named_parameters():
        assert torch.equal(grads[name], param.grad.float())  # this step's gradients, copied
        assert not torch.equal(param.detach(), before[name])  # and the update ran after

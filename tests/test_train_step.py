"""One training state and step for every job: ``TrainStep`` orders zero_grad / data / forward /
loss / backward / update one way and reads the loss one way; each job's step is that step, and
a workload, a recipe's candidate, a memory measurement and a rank are that state."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch import nn

import pytest
from torch.utils.data import DataLoader, TensorDataset

from profilednn.errors import InputError
from profilednn.memory.training import build_on_device, timed_steps
from profilednn.optimization.numerics import record_trajectory
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
    candidate = build_workload("small_cnn", **KNOBS).clone()  # what optimize measures
    assert [plain.run().loss for _ in range(3)] == [candidate.run().loss for _ in range(3)]

    device = build_on_device("small_cnn", **KNOBS)
    fixed = build_workload("small_cnn", **KNOBS)
    first: Any = fixed.batches[0]
    assert [device.run().loss for _ in range(2)] == [fixed.run(first).loss for _ in range(2)]


def test_optimize_reads_gradients_between_backward_and_update() -> None:
    setup = build_workload("small_cnn", **KNOBS)
    before = {n: p.detach().clone() for n, p in setup.model.named_parameters()}
    grads: dict[str, torch.Tensor] = {}
    setup.run(before_update=lambda: grads.update(setup.optimized_grads()))
    assert set(grads) == set(before)
    for name, param in setup.model.named_parameters():
        assert torch.equal(grads[name], param.grad.float())  # this step's gradients, copied
        assert not torch.equal(param.detach(), before[name])  # and the update ran after


def test_optimized_grads_leave_out_frozen_groups() -> None:
    model, _, batches = _tiny()
    opt = torch.optim.SGD([{"params": model[0].parameters()}, {"params": model[2].parameters(), "lr": 0.0}], lr=0.1)
    state = TrainStep(model, opt, nn.CrossEntropyLoss(), batches)
    state.run()
    assert set(state.optimized_grads()) == {"0.weight", "0.bias"}


def test_clone_shares_the_data_but_not_the_parameters() -> None:
    model, opt, batches = _tiny()
    state = TrainStep(model, opt, nn.CrossEntropyLoss(), batches, env={"OMP_NUM_THREADS": "2"}, applied=["a"],
                      name="tiny", build_args={"seed": 0}, config={"notes": []}, items_per_batch=4)
    state.run()  # the original's cursor moves; the clone starts at the data's beginning
    twin = state.clone()
    assert twin.batches is state.batches and twin.data_loader is state.data_loader
    assert twin.next_batch() is batches[0]
    assert all(a is not b and torch.equal(a, b) for a, b in zip(twin.model.parameters(), state.model.parameters()))
    owned = {id(p) for p in twin.model.parameters()}
    assert all(id(p) in owned for g in twin.optimizer.param_groups for p in g["params"])
    assert twin.optimizer.state_dict()["state"].keys() == state.optimizer.state_dict()["state"].keys()
    twin.run()
    assert not torch.equal(twin.model[0].weight, state.model[0].weight)  # training the clone leaves the original
    twin.env["X"], twin.applied[:], twin.build_args["seed"], twin.config["notes"] = "1", ["b"], 1, ["n"]
    assert state.env == {"OMP_NUM_THREADS": "2"} and state.applied == ["a"]
    assert state.build_args == {"seed": 0} and state.config == {"notes": []}
    assert (twin.name, twin.items_per_batch, twin.rebuild_args()) == ("tiny", 4, {"name": "tiny", "seed": 1})


def test_a_compiled_state_cannot_be_cloned() -> None:
    model, opt, batches = _tiny()
    with pytest.raises(InputError, match="clone before torch_compile"):
        TrainStep(model, opt, nn.CrossEntropyLoss(), batches, compiled=True).clone()


def test_one_cursor_serves_next_batch_and_run() -> None:
    model, opt, batches = _tiny()
    state = TrainStep(model, opt, nn.CrossEntropyLoss(), batches)
    seen: list[Any] = []
    assert state.next_batch() is batches[0]
    state.run(phase=lambda name: contextlib.nullcontext(), before_update=lambda: None)
    state.run(lambda: seen.append(state.next_batch()) or seen[-1])  # a batch function may draw from it too
    assert seen == [batches[2]]
    assert state.next_batch() is batches[0]  # cycled: 0 (next_batch), 1 (run), 2 (run's function)
    state.rewind()
    assert state.next_batch() is batches[0]


def test_a_data_loader_is_the_source_and_rewinds() -> None:
    model, opt, _ = _tiny()
    gen = torch.Generator().manual_seed(2)
    data = TensorDataset(torch.randn(6, 8, generator=gen), torch.randint(0, 3, (6,), generator=gen))
    pool = [(torch.zeros(1, 8), torch.zeros(1, dtype=torch.long))]  # a sample only: the loader wins
    state = TrainStep(model, opt, nn.CrossEntropyLoss(), pool, data_loader=DataLoader(data, batch_size=2))
    firsts = [state.next_batch()[0] for _ in range(4)]  # three batches, then the loader starts again
    assert torch.equal(firsts[0], data.tensors[0][:2]) and torch.equal(firsts[3], firsts[0])
    assert state.sample_inputs() is pool[0][0]
    state.run()
    state.rewind()
    assert torch.equal(state.next_batch()[0], data.tensors[0][:2])
    losses = record_trajectory(state, 4, seed=0).losses  # rewinds before and after
    assert len(losses) == 4 and torch.equal(state.next_batch()[0], data.tensors[0][:2])


def test_no_data_is_an_input_error_naming_the_way_out() -> None:
    model, opt, batches = _tiny()
    state = TrainStep(model, opt, nn.CrossEntropyLoss())
    with pytest.raises(InputError, match="pass each run"):
        state.run()
    with pytest.raises(InputError, match="no data"):
        state.sample_inputs()
    assert state.run(batches[0]).loss > 0  # a given batch needs no source


def test_a_built_workload_rebuilds_from_its_identity() -> None:
    built = build_workload("small_cnn", **KNOBS, lr=0.05)
    args = built.rebuild_args()
    assert args == {"name": "small_cnn", **KNOBS, "lr": 0.05, "channels_last": False, "dtype": "fp32"}
    again = build_workload(args.pop("name"), **args)
    assert built.run().loss == again.run().loss
    assert TrainStep(built.model, built.optimizer, built.loss_fn).rebuild_args() is None  # user-built: no identity


def test_memory_places_the_state_on_its_device_with_one_batch() -> None:
    state = build_on_device("small_cnn", **KNOBS)
    assert state.device == torch.device("cpu") and len(state.batches) == 1
    fresh = build_workload("small_cnn", **KNOBS)
    assert torch.equal(state.batches[0][0], fresh.batches[0][0])
    times = timed_steps(state, 2, around_forward=contextlib.nullcontext)
    assert len(times) == 2 and all(t > 0 for t in times)
    with pytest.raises(InputError, match="not available|cannot read"):
        build_on_device("small_cnn", device="nonsense:0", **KNOBS)

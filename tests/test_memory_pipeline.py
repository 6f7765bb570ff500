"""Pipeline: schedules, weight stashing, the balancer, digits accuracy, several processes."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from profilednn.errors import InputError
from profilednn.memory.pipeline import (
    PipelineTrainer,
    as_layer_sequence,
    balance_layers,
    parse_stages,
    split_layers,
    stage_ops,
    train_pipeline,
)
from profilednn.workloads import build_workload

CPU = torch.device("cpu")
LR = 0.5


def _two_stages():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU()), nn.Sequential(nn.Linear(32, 10))


def _micro_batches(n=4, size=8):
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(n * size, 64, generator=gen), torch.randint(0, 10, (n * size,), generator=gen)
    return x, y, list(zip(x.split(size), y.split(size)))


def _trainer(stages, schedule, **kw):
    return PipelineTrainer([copy.deepcopy(s) for s in stages], [CPU, CPU], nn.CrossEntropyLoss(),
                           lambda m: torch.optim.SGD(m.parameters(), lr=LR), schedule=schedule, **kw)


def _weights(trainer):
    return [p.detach() for st in trainer.stages for p in st.module.parameters()]


def test_stage_operation_lists():
    assert stage_ops("gpipe", 0, 2, 3) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("B", 1), ("B", 2)]
    assert stage_ops("1f1b", 0, 2, 3) == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("B", 2)]
    assert stage_ops("1f1b", 1, 2, 3) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)]
    for s in range(3):
        ops = stage_ops("async", s, 3, 5)
        assert sorted(ops) == sorted([("F", m) for m in range(5)] + [("B", m) for m in range(5)])
        assert all(ops.index(("F", m)) < ops.index(("B", m)) for m in range(5))


@pytest.mark.parametrize("schedule, threads", [("gpipe", False), ("1f1b", False), ("1f1b", True)])
def test_synchronous_schedules_match_whole_batch_training(schedule, threads):
    stages = _two_stages()
    x, y, micro = _micro_batches()
    ref = [copy.deepcopy(s) for s in stages]
    nn.CrossEntropyLoss()(ref[1](ref[0](x)), y).backward()
    expected = [p.detach() - LR * p.grad for s in ref for p in s.parameters()]
    trainer = _trainer(stages, schedule, threads=threads)
    result = trainer.run(micro)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(expected, _weights(trainer)))
    # 1F1B keeps at most S - s micro-batches in flight on stage s; GPipe keeps all of them.
    assert result.max_in_flight == ([4, 4] if schedule == "gpipe" else [2, 1])


def _hand_reference(stages, micro):
    """Async 1F1B on two stages, weight versions tracked by hand (stage 0 runs F0 F1 B0 F2
    B1 F3 B2 B3; each backward uses the copy of the weights its forward used)."""
    versions = [copy.deepcopy(stages[0])]
    last = copy.deepcopy(stages[1])
    acts = {}

    def sgd(module, grads):
        new = copy.deepcopy(module)
        with torch.no_grad():
            for p, g in zip(new.parameters(), grads):
                p.add_(g, alpha=-LR)
        return new

    def forward0(m, version):
        acts[m] = (versions[version](micro[m][0]), version)

    def stage1(m):
        nonlocal last
        a = acts[m][0].detach().requires_grad_()
        g = torch.autograd.grad(nn.CrossEntropyLoss()(last(a), micro[m][1]), [a, *last.parameters()])
        last = sgd(last, g[1:])
        return g[0]

    def backward0(m, grad):
        out, version = acts[m]
        g = torch.autograd.grad(out, list(versions[version].parameters()), grad_outputs=grad)
        versions.append(sgd(versions[-1], g))

    forward0(0, 0); forward0(1, 0); backward0(0, stage1(0))
    forward0(2, 1); backward0(1, stage1(1))
    forward0(3, 2); backward0(2, stage1(2))
    backward0(3, stage1(3))
    return [p.detach() for p in [*versions[-1].parameters(), *last.parameters()]]


@pytest.mark.parametrize("threads", [False, True])
def test_weight_stashing_uses_the_forward_weight_version(threads):
    stages = _two_stages()
    _, _, micro = _micro_batches()
    reference = _hand_reference(stages, micro)
    stashed = _trainer(stages, "async", threads=threads)
    result = stashed.run(micro)
    assert all(torch.equal(a, b) for a, b in zip(reference, _weights(stashed)))
    assert result.max_versions[0] == 2  # stage 0 held two weight versions at once
    # Without stashing the backward sees newer weights: the result must differ.
    naive = _trainer(stages, "async", stash=False, threads=threads)
    naive.run(micro)
    assert not all(torch.allclose(a, b, atol=1e-4) for a, b in zip(reference, _weights(naive)))


def test_async_trains_digits_to_plain_accuracy(one_thread, tmp_path):
    """Margin: the async pipeline's test accuracy is within 3 points of plain training with
    the same updates (10 epochs, micro-batches of 16), and so is the averaged model's."""
    result = train_pipeline("digits_mlp", [CPU, CPU], schedule="async", microbatches=4, epochs=10,
                            balance=[3, 2], average=True, runs_dir=tmp_path)
    s = result.summary
    # From Python as from the CLI, the job keeps its outcome as a Run.
    assert result.run is not None and result.run.status == "complete"
    assert result.run.table("pipeline_steps").height == result.steps.height
    assert result.run.manifest["pipeline"]["schedule"] == "async"
    assert s["reference_accuracy"] > 0.93
    assert abs(s["accuracy"] - s["reference_accuracy"]) <= 0.03
    assert abs(s["averaged_accuracy"] - s["reference_accuracy"]) <= 0.03
    assert result.stages["max_weight_versions"].to_list() == [2, 1]


def test_balancer_minimises_the_slowest_stage_and_respects_memory():
    assert balance_layers([1, 1, 1, 1, 4], 2).counts == [4, 1]
    assert balance_layers([4, 1, 1, 1, 1], 2).counts == [1, 4]
    assert balance_layers([1, 1, 1, 1], 2, speeds=[3.0, 1.0]).counts == [3, 1]
    # The fast cut puts 4 layers of 10 bytes on stage 0; a 25-byte cap forbids it.
    cut = balance_layers([1, 1, 1, 1, 4], 2, memory=[10] * 5, memory_caps=[25, None])
    assert cut.counts == [2, 3] and cut.stage_memory == [20, 30]
    with pytest.raises(InputError, match="memory caps"):
        balance_layers([1, 1, 1], 2, memory=[10, 10, 10], memory_caps=[5, 5])
    with pytest.raises(InputError):
        balance_layers([1], 2)


def test_layer_sequence_of_small_cnn_computes_the_same_function():
    wl = build_workload("small_cnn", batch_size=2, image_size=16)
    wl.model.eval()
    seq = as_layer_sequence(wl.model)
    x, _ = wl.next_batch()
    with torch.no_grad():
        assert torch.equal(seq.model(x), wl.model(x))
        stages = split_layers(seq.model, [5, len(seq) - 5])
        assert torch.equal(stages[1](stages[0](x)), wl.model(x))
    assert seq.names[0] == "features.0" and seq.names[-1] == "classifier"
    with pytest.raises(InputError):
        split_layers(seq.model, [1, 1])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_missing_device_is_named():
    with pytest.raises(InputError, match="cuda:0 is not available"):
        parse_stages("cuda:0,cpu")
    assert parse_stages("cpu,cpu") == [CPU, CPU]
    with pytest.raises(InputError):
        parse_stages("cpu")


def test_several_processes_on_torch_pipelining_match_one_process(tmp_path):
    kw = dict(schedule="1f1b", microbatches=4, epochs=1, balance=[3, 2], reference=False, runs_dir=tmp_path)
    multi = train_pipeline("digits_mlp", [CPU, CPU], processes=True, **kw)
    single = train_pipeline("digits_mlp", [CPU, CPU], **kw)
    assert multi.summary["engine"] == "torch.distributed.pipelining"
    assert multi.steps.height == single.steps.height
    assert torch.allclose(torch.tensor(multi.steps["loss"].to_list()), torch.tensor(single.steps["loss"].to_list()),
                          atol=1e-4)
    assert abs(multi.summary["accuracy"] - single.summary["accuracy"]) <= 0.01


def test_a_stage_starting_with_an_inplace_layer_trains():
    torch.manual_seed(0)
    stages = [nn.Sequential(nn.Linear(64, 32)), nn.Sequential(nn.ReLU(inplace=True), nn.Linear(32, 10))]
    x, y, micro = _micro_batches()
    ref = [copy.deepcopy(s) for s in stages]
    nn.CrossEntropyLoss()(ref[1](ref[0](x)), y).backward()
    expected = [p.detach() - LR * p.grad for s in ref for p in s.parameters()]
    for schedule in ("1f1b", "async"):
        trainer = _trainer(stages, schedule)
        trainer.run(micro)
    trainer = _trainer(stages, "gpipe")
    trainer.run(micro)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(expected, _weights(trainer)))

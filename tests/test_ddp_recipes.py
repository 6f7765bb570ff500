"""The DistributedDataParallel recipes of ``optimize -- python train.py`` (``ddp_bucket_view``,
``ddp_static_graph``, ``ddp_bucket_size``, ``ddp_bf16_allreduce``): injected into a tiny DDP
script under a real ``torchrun --standalone --nproc-per-node 2`` (gloo; three launches: the
stock arm, the three argument recipes together, the BF16 hook), and in process on a
one-rank gloo group; ``script_check`` and ``code_edit`` on plain facts."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from profilednn.optimization.ddp_bucket_size import bucket_cap_mb
from profilednn.optimization.ddp_recipe import NO_DDP, ONE_PROCESS, ONE_RANK
from profilednn.optimization.recipe_contract import BF16_TOLERANCE
from profilednn.optimization.recipes import RECIPES, Context
from profilednn.optimization.script.facts import DdpFacts, ScriptFacts
from profilednn.optimization.script.inject import Injector
from profilednn.recipe_catalogue import (
    DDP_BF16_ALLREDUCE, DDP_BUCKET_SIZE, DDP_BUCKET_VIEW, DDP_STATIC_GRAPH, INJECTION_ORDER, entry,
)
from profilednn.topology import cpu_topology
from profilednn.train_step import TrainStep

DDP_RECIPES = (DDP_BUCKET_VIEW, DDP_STATIC_GRAPH, DDP_BUCKET_SIZE, DDP_BF16_ALLREDUCE)
MB = 2**20

# Model a (1.6 MB of gradients: DDP's default buckets are a 1 MB one and the rest) is the
# script's plain DDP; model b passes every argument the recipes set and registers a comm hook
# of its own: it must be left alone in every arm. Each rank writes what DDP holds after each
# backward (the last write: the window's last step).
SCRIPT = textwrap.dedent("""
    import json, sys
    import torch, torch.distributed as dist, torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    a = DDP(nn.Sequential(nn.Linear(64, 600), nn.ReLU(), nn.Linear(600, 600), nn.ReLU(), nn.Linear(600, 4)))
    b = DDP(nn.Linear(4, 4), gradient_as_bucket_view=True, static_graph=True, bucket_cap_mb=5)
    b.register_comm_hook(None, allreduce_hook)
    opt = torch.optim.SGD([*a.parameters(), *b.parameters()], lr=0.1)
    data = torch.Generator().manual_seed(rank)

    def held(m):
        return {"view": m.gradient_as_bucket_view, "static": m.static_graph, "cap": m.bucket_bytes_cap,
                "first": m._bucket_config.first_bucket_bytes_cap, "hooks": [h.__name__ for h, _ in m._comm_hooks],
                "buckets": len(m._get_ddp_logging_data().get("rebuilt_bucket_sizes", "").split(","))}

    for step in range(20):
        opt.zero_grad()
        b(a(torch.randn(8, 64, generator=data))).square().mean().backward()
        with open(sys.argv[1].format(rank=rank), "w") as f:
            json.dump({"a": held(a), "b": held(b)}, f)
        opt.step()
""")
A_GRADIENT_BYTES = 4 * (64 * 600 + 600 + 600 * 600 + 600 + 600 * 4 + 4)


def _arm(tmp_path: Path, name: str, recipes: list[str]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """One arm under torchrun, 2 ranks: each rank's (result, what its DDP models held)."""
    out = tmp_path / name
    out.mkdir()
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    spec = {"argv": ["python", str(script), str(out / "held{rank}.json")], "recipes": recipes,
            "warmup": 2, "steps": 3, "window": True, "seed": 0}
    (out / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "profilednn.optimization.script", str(out / "spec.json"), str(out / "res{rank}.json")],
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return [(json.loads((out / f"res{r}.json").read_text()), json.loads((out / f"held{r}.json").read_text()))
            for r in range(2)]


@pytest.fixture(scope="module")
def arms(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[dict[str, Any], dict[str, Any]]]]:
    tmp = tmp_path_factory.mktemp("ddp")
    return {"stock": _arm(tmp, "stock", []),
            "arguments": _arm(tmp, "arguments", [DDP_BUCKET_VIEW, DDP_STATIC_GRAPH, DDP_BUCKET_SIZE]),
            "bf16": _arm(tmp, "bf16", [DDP_BF16_ALLREDUCE])}


def _ctx() -> Context:
    return Context(cpu_topology(), {})


# --------------------------------------------------------------------------- under torchrun
def test_the_stock_arm_records_each_ddp_model_as_the_script_built_it(arms) -> None:
    for result, held in arms["stock"]:
        assert result["status"] == "window" and result["facts"]["world_size"] == 2 and result["applied"] == {}
        facts = ScriptFacts.from_dict(result["facts"])
        assert facts.world_size == 2
        a, b = facts.ddp
        assert a == DdpFacts("Sequential", gradient_bytes=A_GRADIENT_BYTES, world_size=2)
        assert (b.gradient_as_bucket_view, b.static_graph, b.bucket_cap_mb, b.comm_hook) == (
            True, True, 5, "allreduce_hook")
        assert held["a"] == {"view": False, "static": False, "cap": 25 * MB, "first": MB, "hooks": [], "buckets": 2}
        for name in DDP_RECIPES:  # model a is open to each of them
            assert RECIPES[name].script_check(facts, _ctx()) is None, name


def test_the_argument_recipes_reach_ddp_under_torchrun_with_the_same_losses(arms) -> None:
    for (stock, _), (result, held) in zip(arms["stock"], arms["arguments"]):
        applied = result["applied"]
        assert set(applied) == {DDP_BUCKET_VIEW, DDP_STATIC_GRAPH, DDP_BUCKET_SIZE}
        assert "gradient_as_bucket_view=True" in applied[DDP_BUCKET_VIEW]
        assert "static_graph=True" in applied[DDP_STATIC_GRAPH]
        assert "bucket_cap_mb=25" in applied[DDP_BUCKET_SIZE] and "1 allreduce(s) a step" in applied[DDP_BUCKET_SIZE]
        assert held["a"] == {"view": True, "static": True, "cap": 25 * MB, "first": 25 * MB, "hooks": [],
                             "buckets": 1}  # one bucket: one allreduce a step
        assert held["b"] == {"view": True, "static": True, "cap": 5 * MB, "first": 5 * MB,
                             "hooks": ["allreduce_hook"], "buckets": 1}  # the script's own, left alone
        assert result["losses"] == stock["losses"] and len(result["losses"]) == 5
        a = ScriptFacts.from_dict(result["facts"]).ddp[0]  # the facts say what the script passed
        assert (a.gradient_as_bucket_view, a.static_graph, a.bucket_cap_mb) == (None, None, None)


def test_the_bf16_hook_reaches_the_model_without_one_and_trains_as_stock(arms) -> None:
    for (stock, _), (result, held) in zip(arms["stock"], arms["bf16"]):
        assert "allreduced in BF16" in result["applied"][DDP_BF16_ALLREDUCE]
        assert held["a"]["hooks"] == ["bf16_allreduce_hook"] and held["b"]["hooks"] == ["allreduce_hook"]
        assert ScriptFacts.from_dict(result["facts"]).ddp[0].comm_hook is None  # ours is not the script's
        for x, y in zip(result["losses"], stock["losses"]):
            assert math.isfinite(x) and abs(x - y) <= BF16_TOLERANCE.loss_rtol * abs(y)


# --------------------------------------------------------------------------- in process, one rank
@pytest.fixture
def one_rank_group():
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_a_model_built_with_the_argument_is_left_alone_and_torch_restored(one_rank_group) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    init, register = DistributedDataParallel.__init__, DistributedDataParallel.register_comm_hook
    injector = Injector(list(DDP_RECIPES))
    injector.install()
    try:
        own = DistributedDataParallel(nn.Linear(4, 4), gradient_as_bucket_view=True, static_graph=True,
                                      bucket_cap_mb=5)
        own.register_comm_hook(None, allreduce_hook)
        own(torch.randn(2, 4)).sum().backward()
    finally:
        injector.remove()
    assert injector.applied == {}  # nothing to change: no recipe says it did anything
    assert (own.gradient_as_bucket_view, own.static_graph, own.bucket_bytes_cap) == (True, True, 5 * MB)
    assert [h.__name__ for h, _ in own._comm_hooks] == ["allreduce_hook"]
    (facts,) = injector.facts.ddp
    assert (facts.gradient_as_bucket_view, facts.comm_hook, facts.world_size) == (True, "allreduce_hook", 1)
    assert DistributedDataParallel.__init__ is init and DistributedDataParallel.register_comm_hook is register


def test_a_plain_model_gets_each_argument_and_the_hook_at_its_first_call(one_rank_group) -> None:
    injector = Injector(list(DDP_RECIPES))
    injector.install()
    try:
        model = DistributedDataParallel(nn.Linear(4, 4))
        assert model._comm_hooks == []  # the hook waits for the first call
        model(torch.randn(2, 4)).sum().backward()
        torch.optim.SGD(model.parameters(), lr=0.1).step()
    finally:
        injector.remove()
    assert set(injector.applied) == set(DDP_RECIPES)
    assert (model.gradient_as_bucket_view, model.static_graph, model.bucket_bytes_cap) == (True, True, 25 * MB)
    assert [h.__name__ for h, _ in model._comm_hooks] == ["bf16_allreduce_hook"]
    assert injector.facts.ddp[0].comm_hook is None and injector.facts.world_size == 1


# --------------------------------------------------------------------------- plain facts
def _facts(**model: Any) -> ScriptFacts:
    return ScriptFacts(ddp=[DdpFacts("Net", **{"gradient_bytes": 8 * MB, "world_size": 2, **model})], world_size=2)


def test_script_check_says_why_each_recipe_does_not_apply() -> None:
    ctx = _ctx()
    for name in DDP_RECIPES:
        assert RECIPES[name].script_check(ScriptFacts(), ctx) == NO_DDP
        assert RECIPES[name].script_check(_facts(), ctx) is None
    check = {name: RECIPES[name].script_check for name in DDP_RECIPES}
    assert check[DDP_BUCKET_VIEW](_facts(gradient_as_bucket_view=True), ctx) == (
        "the script passes gradient_as_bucket_view=True to DistributedDataParallel itself")
    assert check[DDP_STATIC_GRAPH](_facts(static_graph=False), ctx) == (
        "the script passes static_graph=False to DistributedDataParallel itself")
    varying = _facts(find_unused_parameters=True, unused_parameters=3)
    assert "not a static graph" in check[DDP_STATIC_GRAPH](varying, ctx)
    assert check[DDP_STATIC_GRAPH](_facts(find_unused_parameters=True), ctx) is None  # all used: static
    assert "bucket_cap_mb=25" in check[DDP_BUCKET_SIZE](_facts(bucket_cap_mb=25), ctx)
    assert "already travel in one bucket" in check[DDP_BUCKET_SIZE](_facts(gradient_bytes=MB // 2), ctx)
    assert check[DDP_BF16_ALLREDUCE](_facts(comm_hook="powerSGD_hook"), ctx) == (
        "the script registers a comm hook of its own (powerSGD_hook)")
    for name in (DDP_BUCKET_SIZE, DDP_BF16_ALLREDUCE):
        assert check[name](_facts(world_size=1), ctx) == ONE_RANK


def test_the_built_in_optimize_never_applies_them_and_the_catalogue_places_them_last_among_injected() -> None:
    model = nn.Linear(4, 2)
    setup = TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(),
                      [(torch.randn(2, 4), torch.randn(2, 2))])
    for name in DDP_RECIPES:
        assert RECIPES[name].check(setup, _ctx()) == ONE_PROCESS
        assert not entry(name).process_start
    assert INJECTION_ORDER[-4:] == DDP_RECIPES
    assert [RECIPES[n].gate_kind for n in DDP_RECIPES] == ["environment", "environment", "arithmetic", "precision"]


def test_the_bucket_cap_holds_every_gradient_in_one_bucket_up_to_256_mb_and_the_edits_say_so() -> None:
    assert [bucket_cap_mb(b) for b in (MB // 2, 8 * MB, 100 * MB, 1024 * MB)] == [25, 25, 101, 256]
    facts = _facts(gradient_bytes=100 * MB)
    assert RECIPES[DDP_BUCKET_SIZE].code_edit(facts) == "DistributedDataParallel(model, ..., bucket_cap_mb=101)"
    assert RECIPES[DDP_BUCKET_VIEW].code_edit(facts) == (
        "DistributedDataParallel(model, ..., gradient_as_bucket_view=True)")
    assert RECIPES[DDP_STATIC_GRAPH].code_edit(facts) == "DistributedDataParallel(model, ..., static_graph=True)"
    assert "register_comm_hook(None, lambda group, bucket: bf16_compress_hook(group, bucket))" in (
        RECIPES[DDP_BF16_ALLREDUCE].code_edit(facts) or "")
    assert ScriptFacts.from_dict(json.loads(json.dumps(facts.to_dict()))) == facts

"""Replay of each oneDNN driver at tiny shapes reproduces the implementation and direction."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import polars as pl
import pytest
import torch

from profilednn.projection.cases import primitive_case, unique_primitives
from profilednn.projection.replay import match_primitives, run_worker
from profilednn.verbose import read_log

# Each call makes PyTorch create oneDNN primitives of one driver (fp32, 1 thread).
ORIGINALS = textwrap.dedent("""
    import torch, torch.nn.functional as F
    torch.set_num_threads(1); torch.manual_seed(0)
    x = torch.randn(2, 8, 16, 16, requires_grad=True)
    conv = torch.nn.Conv2d(8, 16, 3, padding=1, bias=True)
    conv(x).sum().backward()
    with torch.no_grad():
        torch.nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1)(torch.randn(2, 8, 8, 8))
        xm = torch.randn(2, 8, 64, 64).to_mkldnn()  # ~10 us each: above oneDNN's ~1 us timer step
        torch.relu(xm); F.max_pool2d(xm, 2, 2, 0); torch.add(xm, xm)
        torch.batch_norm(xm, torch.ones(8), torch.zeros(8), torch.zeros(8), torch.ones(8),
                         False, 0.1, 1e-5, False)
        xm.to_dense()
""")


@pytest.fixture(scope="module")
def originals(tmp_path_factory) -> pl.DataFrame:
    log = tmp_path_factory.mktemp("orig") / "verbose.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEDNN_VERBOSE")}
    env.update(ONEDNN_VERBOSE="profile_exec", OMP_NUM_THREADS="1")
    with open(log, "wb") as fh:
        subprocess.run([sys.executable, "-c", ORIGINALS], stdout=fh, env=env, check=True)
    return read_log(log).filter(pl.col("event") == "exec")


@pytest.fixture(scope="module")
def replayed(originals, tmp_path_factory) -> pl.DataFrame:
    unique = unique_primitives(originals)
    cases, notes = [], []
    for row in unique.iter_rows(named=True):
        case, why = primitive_case(row)
        notes.append(why)
        if case is not None:
            cases.append({**case, "id": row["case_id"]})
    unique = unique.with_columns(pl.Series("note", notes, dtype=pl.Utf8))
    result = run_worker(cases, 1, budget_s=0.01, min_reps=3, max_reps=5,
                        keep_dir=tmp_path_factory.mktemp("replay"))
    assert not [r for r in result.cases.values() if r.get("error")]
    return match_primitives(unique, result)


@pytest.mark.parametrize("driver,direction", [
    ("conv", "FWD_B"), ("conv", "BWD_D"), ("conv", "BWD_WB"), ("deconv", "FWD_B"),
    ("eltwise", "FWD_D"), ("pool", "FWD_I"), ("bnorm", "FWD_I"), ("sum", None),
])
def test_each_driver_replays_with_the_same_impl_and_direction(replayed, driver, direction) -> None:
    rows = replayed.filter((pl.col("driver") == driver)
                           & (pl.col("direction").is_null() if direction is None
                              else pl.col("direction") == direction))
    assert rows.height == 1, f"the originals must hold one {driver} {direction}"
    row = rows.row(0, named=True)
    assert row["match"] == "exact", row["note"]
    assert row["same_impl"] is True and row["replay_impl"] == row["impl"]
    assert row["replay_ms"] is not None and row["replay_ms"] > 0
    assert row["replay_wall_ms"] is not None and row["replay_wall_ms"] > 0


def test_activation_reorders_are_found_in_the_replay(replayed) -> None:
    reorders = replayed.filter(pl.col("driver") == "reorder")
    assert reorders.height >= 3
    assert reorders["match"].str.starts_with("exact").all(), reorders["note"].to_list()
    assert reorders["same_impl"].all()


def test_conv_flops_agree_with_torch_flop_counter(originals) -> None:
    from torch.utils.flop_counter import FlopCounterMode

    fwd = originals.filter((pl.col("driver") == "conv") & (pl.col("direction") == "FWD_B")).row(0, named=True)
    x, w = torch.randn(2, 8, 16, 16), torch.randn(16, 8, 3, 3)
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.conv2d(x, w, padding=1)
    assert fwd["flops_dense"] == pytest.approx(counter.get_total_flops())


def test_a_primitive_pytorch_cannot_call_alone_says_why() -> None:
    case, why = primitive_case({"driver": "rnn", "dims": "2x8", "problem": "2x8"})
    assert case is None and "rnn" in why
    case, why = primitive_case({"driver": "conv", "direction": "FWD_D", "src_tag": "abcd", "mb": 1,
                                "g": 1, "ic": 2, "oc": 2, "ih": 8, "iw": 8, "oh": 9, "ow": 9,
                                "kh": 3, "kw": 3, "sh": 1, "sw": 1, "dh": 0, "dw": 0, "ph": 1,
                                "pw": 1})
    assert case is None and "symmetric padding" in why

"""Fragmentation: stretches of short ops (fusion candidates) and reorder chains."""

from __future__ import annotations

import polars as pl
import pytest

from profilednn import Analysis
from profilednn.analysis.fragmentation import fragments, reorder_chains

from runfactory import make_run


def events(rows: list[tuple[str, float, float, int]]) -> pl.DataFrame:
    """(op, start_ms, dur_ms, depth) on one thread."""
    return pl.DataFrame(
        {
            "op": [r[0] for r in rows], "start_ms": [r[1] for r in rows], "dur_ms": [r[2] for r in rows],
            "depth": [r[3] for r in rows], "tid": [1] * len(rows), "module": ["m"] * len(rows),
            "phase": ["forward"] * len(rows), "step": [0] * len(rows),
        }
    )


def test_short_ops_between_long_ones_form_one_fragment():
    rows = [("aten::conv2d", 0.0, 5.0, 0)]
    rows += [(f"aten::mul", 5.1 + 0.1 * i, 0.05, 0) for i in range(10)]
    rows += [("aten::conv2d", 7.0, 5.0, 0)]
    f = fragments(events(rows), short_ms=0.1, min_ops=8)
    assert f.height == 1
    r = f.row(0, named=True)
    assert r["n_ops"] == 10 and r["parent"] == "(top level)"
    assert r["op_ms"] == pytest.approx(0.5)
    assert r["span_ms"] == pytest.approx(0.95)
    assert r["gap_ms"] == pytest.approx(0.45)
    assert r["ops"] == "aten::mul\u00d710"


def test_too_few_short_ops_are_not_a_fragment():
    rows = [(f"aten::add", 0.1 * i, 0.05, 0) for i in range(7)]
    assert fragments(events(rows), short_ms=0.1, min_ops=8).height == 0


def test_children_of_a_long_op_are_searched():
    rows = [("Optimizer.step#SGD.step", 0.0, 3.0, 0)]
    rows += [("aten::add_", 0.01 + 0.1 * i, 0.04, 1) for i in range(20)]
    f = fragments(events(rows), short_ms=0.1, min_ops=8)
    assert f.height == 1 and f["parent"][0] == "Optimizer.step#SGD.step" and f["n_ops"][0] == 20


def test_fragments_of_a_run_point_at_the_chain(tmp_path):
    a = Analysis(make_run(tmp_path, fragment_ops=60).path)
    f = a.fragments()
    assert f.height == a.n_steps  # one stretch per step
    assert set(f["module"].to_list()) == {"head.post"}
    assert (f["n_ops"] >= 60).all()  # the chain, and the short loss ops after it
    summary = a.fragmentation_summary()
    assert summary["phase"].to_list() == ["forward"]
    assert summary["share_pct"][0] > 0


def test_per_parameter_optimizer_is_fragmented(tmp_path):
    f = Analysis(make_run(tmp_path, optimizer="per_param").path).fragments()
    opt = f.filter(pl.col("phase") == "optimizer")
    assert opt.height == 3 and opt["parent"][0] == "Optimizer.step#SGD.step"


def test_reorder_round_trips_on_nchw(tmp_path):
    nchw = Analysis(make_run(tmp_path, layout="nchw").path)
    chains = nchw.reorder_chains()
    assert chains.height > 0 and chains["round_trips"].sum() > 0
    assert chains["path"].str.contains("aBcd8b\u2192abcd, abcd\u2192aBcd8b").any()
    reorders = nchw.reorders()
    assert set(reorders["tensor"].to_list()) == {"weights", "activations"}
    nhwc = Analysis(make_run(tmp_path, layout="nhwc").path)
    assert set(nhwc.reorders()["tensor"].to_list()) == {"weights"}


def test_reorder_chains_stop_at_other_primitives():
    prims = pl.DataFrame(
        {
            "driver": ["reorder", "reorder", "conv", "reorder"],
            "src_tag": ["aBcd8b", "abcd", "abcd", "abcd"],
            "dst_tag": ["abcd", "aBcd8b", "aBcd8b", "Acdb8a"],
            "dims": ["2x8x4x4", "2x8x4x4", None, "8x8x3x3"],
            "time_ms": [1.0, 2.0, 5.0, 0.5],
            "timestamp_ms": [0.0, 1.0, 3.0, 9.0],
            "step": [0, 0, 0, 0],
            "line": [1, 2, 3, 4],
            "module": ["a", "a", "a", "b"],
            "phase": ["forward"] * 4,
        }
    )
    chains = reorder_chains(prims, min_len=1)
    assert chains["n"].to_list() == [2, 1]
    assert chains["round_trips"].to_list() == [1, 0]
    assert chains["time_ms"][0] == pytest.approx(3.0)


def test_children_of_a_long_native_op_are_its_own_work():
    rows = [("aten::_slow_conv2d_backward", 0.0, 3.0, 0)]
    rows += [("aten::empty", 0.01 + 0.1 * i, 0.01, 1) for i in range(20)]
    assert fragments(events(rows), short_ms=0.1, min_ops=8).height == 0


def test_an_optimizer_chain_is_sent_to_fused_optimizer_not_to_a_compiler(tmp_path):
    a = Analysis(make_run(tmp_path, optimizer="per_param", optimizer_scale=3.0, image=8).path)
    top = a.fragments().sort("span_ms", descending=True).row(0, named=True)
    advice = {x.rule: x for x in a.advice()}
    frag = advice.get("fragmentation")
    if top["phase"] != "optimizer":
        pytest.fail(f"the run's largest stretch should be the optimizer's, got {top['phase']}")
    assert frag is not None and frag.recipe == "fused_optimizer"
    assert "fused=True" in frag.action and "torch.compile" not in frag.action
    assert "recipes='fused_optimizer'" in frag.action and "torch_compile" not in frag.action  # the next step
    assert set(frag.to_dict()) == {"rule", "severity", "evidence", "estimated_gain_pct", "action"}
    forward = {x.rule: x for x in Analysis(make_run(tmp_path / "f", fragment_ops=60, image=8).path).advice()}["fragmentation"]
    assert forward.recipe is None and "torch.compile" in forward.action and "recipes='torch_compile'" in forward.action

"""The ``dropout_masks`` advice: the stock dropout sites ``fuse_dropout`` swaps, their gain
(``FUSED_DROPOUT_SAVING`` of their time), the masks drawn where the swap does not reach, and
the next step for a script Run whose recipe ``optimize`` cannot inject."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from runfactory import make_run

from profilednn import recipe_catalogue
from profilednn.analysis import Analysis, advise
from profilednn.analysis.actions import check_action, snippet_callables
from profilednn.analysis.dropout_rules import DROPOUT_MIN_PCT, FUSED_DROPOUT_SAVING, dropout_masks
from profilednn.analysis.next_steps import next_step
from profilednn.tables import LAYERS

SCRIPT = ("python", "train.py", "--lr", "0.1")


def _fired(a: Analysis):
    hits = [x for x in advise(a) if x.rule == "dropout_masks"]
    return hits[0] if hits else None


def _dropout_layer_ms(a: Analysis) -> float:
    """The nn.Dropout layer's forward + backward time per step, from the Run's layers table."""
    rows = a.layers.filter((pl.col("module_type") == "Dropout") & pl.col("phase").is_in(["forward", "backward"]))
    assert set(rows["phase"]) == {"forward", "backward"}
    return float(rows["time_ms"].sum()) / a.n_steps


def _masks_ms(a: Analysis, module: str) -> float:
    rows = a.ops.filter((pl.col("op") == "aten::bernoulli_") & (pl.col("module") == module))
    return float(rows["self_time_ms"].sum()) / a.n_steps


def test_fires_with_the_saving_of_the_dropout_layers_time(tmp_path: Path) -> None:
    a = Analysis(make_run(tmp_path, dropout_scale=20.0).path)
    adv = _fired(a)
    assert adv is not None
    layer_ms = _dropout_layer_ms(a)
    assert adv.estimated_gain_pct == pytest.approx(FUSED_DROPOUT_SAVING * layer_ms / a.step_ms * 100.0)
    assert adv.estimated_gain_pct >= DROPOUT_MIN_PCT
    masks = _masks_ms(a, "layer1.0.drop")
    assert f"aten::bernoulli_: {masks:.2f} ms per step" in adv.evidence
    assert f"take {layer_ms:.2f} ms per step (1 nn.Dropout module(s), forward+backward)" in adv.evidence
    assert "outside those sites" not in adv.evidence and "stays stock" not in adv.action
    assert "profilednn.kernels.fuse_dropout" in snippet_callables(adv.action) and not check_action(adv.action)
    assert "(seed, offset)" in adv.action and "random-stream gate" in adv.action
    assert "MultiheadAttention" not in adv.action  # this Run has no attention


def test_quiet_below_two_percent_of_the_step(tmp_path: Path) -> None:
    a = Analysis(make_run(tmp_path, dropout_scale=4.0).path)
    gain = FUSED_DROPOUT_SAVING * _dropout_layer_ms(a) / a.step_ms * 100.0
    assert 0.0 < gain < DROPOUT_MIN_PCT
    assert _fired(a) is None


def test_quiet_when_the_sites_are_fused_already(tmp_path: Path) -> None:
    a = Analysis(make_run(tmp_path / "fused", dropout_scale=20.0, dropout_type="FusedDropout").path)
    assert a.layers.filter(pl.col("module_type") == "FusedDropout").height  # the site ran, fused
    assert _fired(a) is None
    # masks drawn functionally beside a fused module: nothing the swap takes, so no advice
    b = Analysis(make_run(tmp_path / "functional", dropout_scale=20.0, dropout_type="FusedDropout",
                          attention_dropout="CausalSelfAttention", attention_dropout_scale=40.0).path)
    assert _masks_ms(b, "layer1.0.attn") / b.step_ms * 100.0 > DROPOUT_MIN_PCT
    assert _fired(b) is None


def test_functional_dropout_is_named_with_its_time_and_left_out_of_the_gain(tmp_path: Path) -> None:
    a = Analysis(make_run(tmp_path, dropout_scale=20.0, attention_dropout="CausalSelfAttention",
                          attention_dropout_scale=20.0).path)
    adv = _fired(a)
    assert adv is not None
    assert adv.estimated_gain_pct == pytest.approx(FUSED_DROPOUT_SAVING * _dropout_layer_ms(a) / a.step_ms * 100.0)
    functional = _masks_ms(a, "layer1.0.attn")
    assert functional > 0
    assert (f"{functional:.2f} ms per step of aten::bernoulli_ ({functional / a.step_ms * 100.0:.1f}% of the step) "
            "runs outside those sites, in CausalSelfAttention (layer1.0.attn)") in adv.evidence
    assert "the fused kernel does not reach" in adv.evidence
    assert f"The dropout applied functionally ({functional:.2f} ms of masks per step here) stays stock" in adv.action
    assert "profilednn.kernels.fused_dropout" in snippet_callables(adv.action) and not check_action(adv.action)


def test_multihead_attention_dropout_counts_as_swappable(tmp_path: Path) -> None:
    a = Analysis(make_run(tmp_path, attention_dropout="MultiheadAttention", attention_dropout_scale=20.0).path)
    adv = _fired(a)
    assert adv is not None
    dropout = a.ops.filter((pl.col("op") == "aten::dropout") & (pl.col("module") == "layer1.0.attn"))
    site_ms = float(dropout["total_time_ms"].sum()) / a.n_steps
    assert site_ms > _masks_ms(a, "layer1.0.attn") > 0  # the whole aten::dropout: mask, divide, multiply
    assert adv.estimated_gain_pct == pytest.approx(FUSED_DROPOUT_SAVING * site_ms / a.step_ms * 100.0)
    assert "1 nn.MultiheadAttention attention dropout(s), forward" in adv.evidence
    assert "FusedDropoutAttention" in adv.action and "outside those sites" not in adv.evidence


def test_scaled_dot_product_attention_dropout_counts_as_swappable(tmp_path: Path) -> None:
    a = Analysis(make_run(tmp_path, attention_dropout="CausalSelfAttention", attention_dropout_scale=20.0,
                          attention_sdpa=True).path)
    adv = _fired(a)
    assert adv is not None
    dropout = a.ops.filter((pl.col("op") == "aten::dropout") & (pl.col("module") == "layer1.0.attn"))
    site_ms = float(dropout["total_time_ms"].sum()) / a.n_steps
    assert site_ms > _masks_ms(a, "layer1.0.attn") > 0
    assert adv.estimated_gain_pct == pytest.approx(FUSED_DROPOUT_SAVING * site_ms / a.step_ms * 100.0)
    assert "scaled_dot_product_attention's dropout_p in 1 module(s), forward" in adv.evidence
    assert "outside those sites" not in adv.evidence and "stays stock" not in adv.action
    assert "profilednn.kernels.scaled_dot_product_attention" in snippet_callables(adv.action)
    assert not check_action(adv.action)


def test_quiet_without_ops_or_layers(tmp_path: Path) -> None:
    assert _fired(Analysis(make_run(tmp_path / "light", dropout_scale=20.0, light=True).path)) is None
    run = make_run(tmp_path / "no_layers", dropout_scale=20.0)
    assert _fired(Analysis(run.path)) is not None
    run.table_path(LAYERS.name).unlink()
    run.update(tables=[t for t in run.promised_tables() if t != LAYERS.name])
    a = Analysis(run.path)
    assert a.layers is None and a.ops is not None
    assert dropout_masks(a) is None


def test_a_script_run_is_sent_to_the_edit_when_optimize_cannot_inject_the_recipe(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the injectable set is read at each call: without fused_dropout (today), the edit by hand
    others = tuple(r for r in recipe_catalogue.INJECTABLE if r != "fused_dropout")
    monkeypatch.setattr(recipe_catalogue, "INJECTABLE", others)
    a = Analysis(make_run(tmp_path, dropout_scale=20.0, script_argv=SCRIPT).path)
    adv = _fired(a)
    assert adv is not None
    assert "`profilednn optimize` cannot inject recipe fused_dropout into a script yet" in adv.action
    assert "by hand and profile it again (`profilednn profile -- python train.py --lr 0.1`)" in adv.action
    assert "`profilednn optimize -- " not in adv.action  # no command that would not try the recipe
    assert "`profilednn.optimize(model, optimizer, loss_fn, (inputs, targets), recipes='fused_dropout')`" in adv.action
    assert not check_action(adv.action)
    # an injectable recipe keeps the script's own optimize command
    assert next_step(a, "conv_weight_grad") == ("Try it on this workload, A/B-timed and numerics-checked: "
                                                "`profilednn optimize -- python train.py --lr 0.1` "
                                                "(recipe pointwise_gemm).")
    # once fused_dropout is injectable, optimize -- is named
    monkeypatch.setattr(recipe_catalogue, "INJECTABLE", (*others, "fused_dropout"))
    assert next_step(a, "dropout_masks") == (
        "Try it on this workload, A/B-timed and numerics-checked: "
        "`profilednn optimize -- python train.py --lr 0.1` (recipe fused_dropout).")


def test_the_script_injector_acts_on_the_same_set() -> None:
    from profilednn.optimization.script import inject

    assert inject.INJECTABLE is recipe_catalogue.INJECTABLE

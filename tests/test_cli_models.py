"""``profilednn models``: the workload table and its JSON form."""

from __future__ import annotations

import json

from profilednn.cli import run_cli
from profilednn.workloads import list_workloads


def test_models_prints_a_table_of_every_workload(capsys):
    assert run_cli(["models"]) == 0
    out = capsys.readouterr().out
    for spec in list_workloads():
        assert spec.name in out
    assert "batch_size=16" in out  # a default
    assert "positive_fraction=0.002" in out  # a workload-specific knob
    assert "dtype" in out and "channels_last" in out and "seed" in out


def test_models_json_lists_defaults_and_knobs(capsys):
    assert run_cli(["models", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_name = {row["name"]: row for row in rows}
    assert set(by_name) == {spec.name for spec in list_workloads()}
    retinanet = by_name["retinanet_resnext50_fpn"]
    assert retinanet["defaults"]["num_classes"] == 91
    assert retinanet["defaults"]["image_size"] == 512
    assert "trainable_layers" in retinanet["knobs"]
    assert by_name["bert_base"]["defaults"]["seq_len"] == 128
    assert by_name["alexnet"]["min_image_size"] == 63
    assert by_name["lstm_lm"]["item"] == "sequences"

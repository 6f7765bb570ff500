"""The table catalogue: every table a job writes is named once (``profilednn.tables``), with
its owner and the columns readers rely on; the ``steps`` table has one schema."""

from __future__ import annotations

import ast
from pathlib import Path

import polars as pl
import pytest

from profilednn.errors import RunError
from profilednn.run import create_run
from profilednn.tables import (
    JOBS,
    OPTIMIZE_RECIPES,
    OPTIMIZE_SAMPLES,
    PHASES,
    STEPS,
    STEPS_SCHEMA,
    TABLES,
    steps_frame,
    tables_of,
)

SRC = Path(__file__).resolve().parents[1] / "src" / "profilednn"
TABLE_CALLS = {"write_table", "table", "has_table", "need", "_load"}


def test_every_table_has_a_job_and_its_required_columns_in_its_schema() -> None:
    for table in TABLES.values():
        assert table.owner in JOBS, table
        if table.schema is not None:
            assert set(table.required) <= set(table.schema), table.name
    assert {t.name for job in JOBS for t in tables_of(job)} == set(TABLES)
    with pytest.raises(ValueError, match="unknown job"):
        tables_of("nonsense")


def test_the_steps_schema_has_one_column_per_phase() -> None:
    assert [c for c in STEPS_SCHEMA if c.endswith("_ms") and c != "time_ms"] == [f"{p}_ms" for p in PHASES]
    frame = steps_frame([{"step": 0, "time_ms": 1.5}])
    assert frame.schema == pl.Schema(STEPS_SCHEMA)
    assert frame["loss"][0] is None and frame["time_ms"][0] == 1.5


def test_no_module_names_a_table_with_a_string_literal() -> None:
    """Writers and readers name tables through the catalogue, so a rename is one edit."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in TABLE_CALLS and node.args
                    and isinstance(node.args[0], ast.Constant) and node.args[0].value in TABLES):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}: {node.func.attr}({node.args[0].value!r})")
    assert not found, "use the profilednn.tables catalogue:\n" + "\n".join(found)


def test_a_catalogued_table_without_the_columns_readers_need_is_refused(tmp_path: Path) -> None:
    with create_run(tmp_path) as run:
        with pytest.raises(RunError, match="time_ms"):
            run.write_table(STEPS, pl.DataFrame({"step": [0]}))
        assert not run.has_table(STEPS)
        run.write_table(STEPS, steps_frame([{"step": 0, "time_ms": 2.0}]))
        assert run.table(STEPS)["time_ms"].to_list() == [2.0] and run.promised_tables() == ["steps"]


def test_optimize_and_distributed_write_the_capture_steps_schema(tmp_path: Path) -> None:
    from profilednn.distributed import trainer
    from profilednn.optimization import Settings
    from profilednn.optimization.workload import optimize_workload

    settings = Settings(rounds=2, warmup=0, numerics_steps=2, measure_flops=False, final_ab=True)
    run, _ = optimize_workload("small_cnn", tmp_path, recipes="fused_optimizer", settings=settings,
                               batch_size=2, image_size=16)
    assert run.table(STEPS).schema == pl.Schema(STEPS_SCHEMA)
    assert run.table(STEPS)["time_ms"].drop_nulls().len() == run.table(STEPS).height > 0
    for table in (OPTIMIZE_RECIPES, OPTIMIZE_SAMPLES):
        assert run.table(table).schema == pl.Schema(table.schema), table.name
    result = trainer.train(trainer.TrainConfig(model="small_cnn", batch_size=2, image_size=16, steps=2,
                                               runs_dir=tmp_path / "dist", measure_comm=False))
    assert result.run.table(STEPS).schema == pl.Schema(STEPS_SCHEMA)
    assert result.run.table(STEPS).height == 2


def test_every_table_names_the_columns_its_readers_rely_on(tmp_path: Path) -> None:
    """Schema-free tables (the projection's) still say which columns readers need; a frame
    with no columns at all (the job had nothing of that kind) is written as is."""
    from profilednn.tables import PROJECTION_BREAKDOWN

    assert all(t.schema is not None or t.required for t in TABLES.values())
    with create_run(tmp_path) as run:
        with pytest.raises(RunError, match="efficiency"):
            run.write_table(PROJECTION_BREAKDOWN, pl.DataFrame({"level": ["driver"], "name": ["conv"],
                                                                "in_situ_ms": [1.0], "projected_ms": [1.0]}))
        run.write_table(PROJECTION_BREAKDOWN, pl.DataFrame())
        assert run.has_table(PROJECTION_BREAKDOWN)

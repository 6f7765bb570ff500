"""Each shared fact is written once: static checks over ``src/`` with ``ast`` (nothing is
imported for them), and a few checks that the places that read a fact agree.

The facts: which ISA flags make BF16 native (the topology's answer), the marker event names
(``verbose/markers.py``), the compute-primitive kinds and the convolution drivers, the op
sets (copies, fills, layout changes, batch norm), PyTorch's convolution calls and the step
model's part names.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from profilednn import topology, vocabulary
from profilednn.verbose import markers

SRC = Path(__file__).resolve().parents[1] / "src" / "profilednn"
MODULES: dict[str, ast.Module] = {
    path.relative_to(SRC).as_posix(): ast.parse(path.read_text(), filename=str(path))
    for path in sorted(SRC.rglob("*.py"))
}


def _docstring_ids(tree: ast.Module) -> set[int]:
    """The string statements (docstrings and the like): prose, not a spelled fact."""
    return {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}


def _strings(tree: ast.Module) -> Iterator[str]:
    """Every string constant of a module but its docstrings (f-string pieces included)."""
    prose = _docstring_ids(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            yield node.value


def _modules_spelling(match) -> set[str]:
    return {name for name, tree in MODULES.items() if any(match(s) for s in _strings(tree))}


def _collections(tree: ast.Module) -> Iterator[frozenset[str]]:
    """The string elements of every set, tuple, list literal and dict's keys in a module."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Set, ast.Tuple, ast.List)):
            elts = node.elts
        elif isinstance(node, ast.Dict):
            elts = [k for k in node.keys if k is not None]
        else:
            continue
        values = {e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        if values:
            yield frozenset(values)


def test_native_bf16_flags_are_spelled_in_the_topology_only() -> None:
    assert _modules_spelling(lambda s: s == "avx512_bf16") == {"topology/dtype_policy.py"}
    assert _modules_spelling(lambda s: s == "amx_bf16") == {"topology/dtype_policy.py"}


@pytest.mark.parametrize("flags, native", [
    (["avx512f", "avx512_bf16"], True), (["amx_tile", "amx_bf16"], True), (["avx2", "avx_ne_convert"], False),
    (["avx512f", "avx512_vnni"], False), ([], False),
])
def test_every_reader_gives_the_topologys_native_bf16_answer(flags: list[str], native: bool) -> None:
    from profilednn.analysis.rulebook import NATIVE_BF16_FLAGS, native_bf16
    from profilednn.capture.fingerprint import has_native_bf16

    assert topology.has_native_bf16(flags) is native
    assert has_native_bf16(flags) is native
    assert NATIVE_BF16_FLAGS is topology.NATIVE_BF16_FLAGS
    if flags:  # a fingerprint that records only its flags
        assert native_bf16({"isa_flags": flags}) is native
    assert ("bf16" in topology.topology_from_dict(
        {"model_name": "x", "physical_cores": 1, "isa": flags}).native_dtypes) is native


def test_marker_event_names_are_spelled_in_the_marker_format_only() -> None:
    events = (*markers.CAPTURE_EVENTS, markers.REPLAY_EVENT)
    assert len(set(events)) == len(events)
    spelled = _modules_spelling(lambda s: any(s == e or s.startswith(f"{e},") for e in events))
    assert spelled == {"verbose/markers.py"}


def test_the_marker_state_machine_handles_every_capture_event_but_bwd_end() -> None:
    from profilednn.capture.attribute import _TimelineBuilder

    handled = set(_TimelineBuilder([], {}).handlers)
    assert handled == set(markers.CAPTURE_EVENTS) - {markers.BWD_END}  # bwd_end: runs on to the next begin


@pytest.mark.parametrize("name, exact", [
    ("COMPUTE_DRIVERS", True), ("CONV_DRIVERS", True), ("CONV_ROOTS", False), ("COPY_OPS", False),
    ("LAYOUT_OPS", False), ("BATCH_NORM_OPS", False),
])
def test_no_second_definition_of_a_vocabulary_set(name: str, exact: bool) -> None:
    """No module but the vocabulary writes the set out again: for the driver sets, no literal
    with exactly their names (longer lists of every driver are another fact); for the op sets,
    no literal holding all of them (with or without ``aten::``)."""
    fact = frozenset(getattr(vocabulary, name))

    def restates(values: frozenset[str]) -> bool:
        bare = frozenset(v.removeprefix("aten::") for v in values)
        return values == fact if exact else (fact <= values or frozenset(
            f.removeprefix("aten::") for f in fact) <= bare)

    where = {m for m, tree in MODULES.items() if any(restates(c) for c in _collections(tree))}
    assert where <= {"vocabulary.py"}, f"{name} written again in {sorted(where - {'vocabulary.py'})}"


def test_pytorchs_convolution_calls_are_spelled_in_the_vocabulary_only() -> None:
    assert _modules_spelling(lambda s: s in vocabulary.CONV_ROOTS) == {"vocabulary.py"}


def test_the_step_models_parts_are_named_in_the_step_model_only() -> None:
    from profilednn.projection.step_model import KERNEL_PARTS, PART_ASSUMPTIONS, STEP_PARTS

    assert set(PART_ASSUMPTIONS) == set(STEP_PARTS) and STEP_PARTS[:len(KERNEL_PARTS)] == KERNEL_PARTS
    assert _modules_spelling(lambda s: s in STEP_PARTS) == {"projection/step_model.py"}


def test_torch_dtype_names_are_mapped_in_the_vocabulary_only() -> None:
    torch_names = set(vocabulary.TORCH_DTYPE.values())
    where = {m for m, tree in MODULES.items()
             for node in ast.walk(tree) if isinstance(node, ast.Dict)
             and len(torch_names & {v.value for v in node.values if isinstance(v, ast.Constant)}) > 1}
    assert where == {"vocabulary.py"}


def test_optimizes_family_split_reads_the_vocabularys_op_sets() -> None:
    from profilednn.optimization.op_families import event_family

    for op in vocabulary.aten_names(vocabulary.COPY_OPS | vocabulary.LAYOUT_OPS):
        assert event_family(op) == "copy_layout", op
    for op in vocabulary.aten_names(vocabulary.BATCH_NORM_OPS):
        assert event_family(op) == "batch_norm", op
    for op in vocabulary.aten_names(vocabulary.FILL_OPS | vocabulary.REDUCE_OPS):
        assert event_family(op) in ("elementwise", "reduce_norm"), op

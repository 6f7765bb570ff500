"""The resident memory over a full capture's window (``capture/resident.py``): recorded in
the manifest, and a note when it grew far, blaming torch.profiler only when the unprofiled
warm-up steps before the window grew less than half as fast."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from profilednn.capture import profile_script
from profilednn.capture.resident import GIB, growth_note, resident_bytes, window_record


MIB = 2**20


def test_small_or_relative_small_growth_is_no_note() -> None:
    assert growth_note(window_record(1 * GIB, 1 * GIB + 200 * MIB, 3)) is None  # under 256 MiB
    assert growth_note(window_record(4 * GIB, 4 * GIB + 600 * MIB, 3)) is None  # under 20 % of 4 GiB
    assert growth_note(None) is None
    assert window_record(None, 1 * GIB, 3) is None


def test_growth_far_beyond_the_unprofiled_steps_is_the_profilers() -> None:
    record = window_record(int(1.5 * GIB), int(4.5 * GIB), 3, (int(1.4 * GIB), int(1.5 * GIB), 3))
    note = growth_note(record, [210_000, 200_000, 230_000])
    assert note is not None
    assert note.startswith("the process's resident memory grew 3.00 GiB over the 3 steps torch.profiler watched "
                           "(1.50 -> 4.50 GiB, 1.00 GiB a step), its steps page-faulting 210,000 times each (0.80 GiB)"
                           "; the 3 warm-up steps observed before it grew 0.03 GiB a step: torch.profiler keeps")
    assert "grow with --steps" in note and "--light" in note


def test_a_script_that_grows_by_itself_is_not_blamed_on_the_profiler() -> None:
    record = window_record(2 * GIB, 3 * GIB, 2, (int(0.5 * GIB), 2 * GIB, 3))
    note = growth_note(record)
    assert note is not None and "0.50 GiB a step" in note
    assert note.endswith("the script's memory grows by itself (a leak, or tensors kept across steps), under the "
                         "capture or not")
    assert "torch.profiler keeps" not in note


def test_without_unprofiled_steps_the_note_says_it_could_not_compare() -> None:
    note = growth_note(window_record(1 * GIB, 2 * GIB, 2))
    assert note is not None and "no steps were observed without the profiler to compare with" in note


def test_resident_bytes_sees_memory_touched() -> None:
    """In a fresh process: in pytest's, a garbage collection or another test's thread can free
    as much as the test touches between the two reads (it did once, in a full suite run)."""
    code = textwrap.dedent("""
        from profilednn.capture.resident import resident_bytes
        before = resident_bytes()
        held = bytearray(64 * 2**20)
        held[:: 4096] = b"\\x01" * len(held[:: 4096])  # one byte a page: every page resident
        print(before, resident_bytes())
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    before, after = (int(v) for v in done.stdout.split())
    assert before > 0 and after - before >= 48 * MIB


GROWING = """
    import torch
    from torch import nn
    model = nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kept = []
    for i in range({steps}):
        loss = model(torch.randn(4, 8)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        block = torch.empty({grow_mib} * 2**20, dtype=torch.uint8)
        block.fill_(1)  # every page resident
        kept.append(block)  # kept across steps: the script's own growth
"""


def _script(tmp_path: Path, steps: int, grow_mib: int) -> Path:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(GROWING.format(steps=steps, grow_mib=grow_mib)))
    return path


def test_a_full_capture_records_the_window_and_names_a_scripts_own_growth(tmp_path: Path) -> None:
    """Warm-up 4: steps 1-3 observed without the profiler (the light reference), 4-5 profiled.
    The script keeps a third of this process's memory a step (the note's bar is relative to
    it: 20 %): its growth is its own, and the note says so."""
    grow_mib = max(160, (resident_bytes() or 0) // 3 // MIB)
    run, code = profile_script(["python", str(_script(tmp_path, 6, grow_mib))], tmp_path / "runs", steps=2, warmup=4)
    assert code == 0 and run.status == "complete"
    resident = run.manifest["capture"]["resident"]
    assert resident["steps"] == 2 and resident["unprofiled_steps"] == 3
    grown = resident["window_close_bytes"] - resident["window_open_bytes"]
    assert grown >= 2 * (grow_mib - 10) * MIB  # two steps' blocks kept
    before = resident["window_open_bytes"] - resident["unprofiled_open_bytes"]
    assert before >= 3 * (grow_mib - 10) * MIB
    notes = [n for n in run.manifest["notes"] if n.startswith("the process's resident memory grew")]
    assert len(notes) == 1 and "the script's memory grows by itself" in notes[0], run.manifest["notes"]


def test_a_light_capture_records_no_profiler_window(tmp_path: Path) -> None:
    run, code = profile_script(["python", str(_script(tmp_path, 3, 1))], tmp_path / "runs", steps=1, warmup=1,
                               light=True)
    assert code == 0 and run.status == "complete"
    assert "resident" not in run.manifest["capture"]


def test_a_built_in_full_capture_compares_with_its_light_reference(tmp_path: Path) -> None:
    """A built-in workload has no provisional window before its light reference: the
    reference's own open and close bound the unprofiled steps (warm-up 4: steps 1-3)."""
    from profilednn.capture import profile_builtin

    run = profile_builtin("small_cnn", tmp_path, steps=1, warmup=4, batch_size=2)
    assert run.status == "complete"
    resident = run.manifest["capture"]["resident"]
    assert resident["steps"] == 1 and resident["unprofiled_steps"] == 3
    assert resident["unprofiled_close_bytes"] > 0 and resident["unprofiled_open_bytes"] > 0

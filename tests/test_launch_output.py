"""Real 2-rank gloo launches: each succeeds, its output arrives as whole tagged lines, per-rank
logs stay in the job directory, and the temporary plan directory goes, on success and failure.

The 30-launch stress run is ``benchmarks/bench_launch_stress.py`` (see docs/distributed.md).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow]

# Every rank prints LINES long lines, each with several write() calls (PYTHONUNBUFFERED is
# set by the launcher): through one shared pipe they would tear.
LINES = 20
SCRIPT = f'''
import os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(3) * (rank + 1)
dist.all_reduce(t)
for i in range({LINES}):
    print("rank", rank, "line", i, "x" * 200, "end")
print("stderr of rank", rank, file=sys.stderr)
dist.barrier()
dist.destroy_process_group()
if rank == 1 and os.environ.get("FAIL_RANK1"):
    sys.exit(3)
'''
TAGGED = re.compile(r"^\[rank(\d)\]: rank (\d) line (\d+) x{200} end$")


def _launch(tmp: Path, *extra: str, fail: bool = False) -> subprocess.CompletedProcess:
    """One launch, never retried: rank_entry's clean exit keeps PyTorch's teardown abort
    ("terminate called without an active exception") out of a finished job."""
    script = tmp / "job.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, TMPDIR=str(tmp / "tmp"))
    env.pop("FAIL_RANK1", None)
    if fail:
        env["FAIL_RANK1"] = "1"
    return subprocess.run([sys.executable, "-m", "profilednn", "launch", "--nproc-per-node", "2",
                           "--threads-per-rank", "1", "--timeout", "150", "-o", str(tmp / "runs"), *extra,
                           "--", "python", str(script)],
                          capture_output=True, text=True, timeout=200, env=env, check=False)


@pytest.mark.timeout(400)
def test_repeated_launches_succeed_with_whole_tagged_lines_and_rank_logs(tmp_path: Path) -> None:
    (tmp_path / "tmp").mkdir()
    for i, extra in enumerate([(), ("--ranks", "0")]):
        res = _launch(tmp_path, "--job-id", f"ok{i}", *extra)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
        rank_lines = [ln for ln in res.stdout.splitlines() if ln.startswith("[rank")]
        shown = [0, 1] if not extra else [0]
        assert len(rank_lines) == LINES * len(shown)
        for line in rank_lines:  # whole lines, tagged with the rank that wrote them
            m = TAGGED.match(line)
            assert m is not None and m[1] == m[2], line
        assert sorted({int(TAGGED.match(ln)[1]) for ln in rank_lines}) == shown
        assert ("[rank1]: stderr of rank 1" in res.stderr) == (not extra)
        logs = tmp_path / "runs" / f"ok{i}" / "logs"
        for rank in (0, 1):  # the files keep every rank, filtered or not
            assert (logs / f"rank{rank}.stdout.log").read_text().count(" end\n") == LINES
            assert (logs / f"rank{rank}.stderr.log").read_text().count(f"stderr of rank {rank}") == 1
        assert "terminate called" not in res.stderr
        summary = " ".join(res.stdout.split())
        assert "clean exit: ranks 0,1 ended when the script did" in summary, res.stdout[-1500:]
        assert list((tmp_path / "tmp").glob("profilednn-launch-*")) == []  # plan dir removed


@pytest.mark.timeout(300)
def test_failed_launch_names_the_rank_keeps_its_log_and_removes_the_plan_dir(tmp_path: Path) -> None:
    (tmp_path / "tmp").mkdir()
    res = _launch(tmp_path, "--job-id", "bad", fail=True)
    assert res.returncode == 1
    err = " ".join(res.stderr.split())
    assert "failed: rank 1 (local rank 1" in err and "exited with code 3" in err, err[-2000:]
    assert "clean exit: ranks 0,1 ended when the script did" in err  # rank 1's code 3 is its script's
    assert (tmp_path / "runs" / "bad" / "logs" / "rank1.stdout.log").read_text().count(" end\n") == LINES
    assert list((tmp_path / "tmp").glob("profilednn-launch-*")) == []

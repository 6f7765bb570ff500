"""Small scripts the data-parallel tests launch under torchrun (gloo, loopback): one that
never initialises a process group, one whose rank 1 raises at its third step, a DDP one
with a --batch-size option."""

from __future__ import annotations

import textwrap
from pathlib import Path

NOT_DISTRIBUTED = textwrap.dedent("""
    import torch, torch.nn as nn
    model = nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(30):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
""")

RANK_ONE_RAISES = textwrap.dedent("""
    import torch, torch.distributed as dist, torch.nn as nn
    dist.init_process_group("gloo")
    model = nn.parallel.DistributedDataParallel(nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(30):
        if step == 2 and dist.get_rank() == 1:
            raise ValueError("rank one cannot go on")
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
""")


# A DDP script whose per-rank batch is its --batch-size option; each rank prints its end.
DDP_BATCH_SCRIPT = textwrap.dedent("""
    import argparse
    import torch, torch.distributed as dist, torch.nn as nn
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(dist.get_rank())
    for step in range(40):
        x, y = torch.randn(args.batch_size, 32, generator=data), torch.randint(0, 4, (args.batch_size,), generator=data)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    print(f"trained on rank {dist.get_rank()} of {dist.get_world_size()} with batch {args.batch_size}", flush=True)
    dist.destroy_process_group()
""")


def write_script(folder: Path, name: str, text: str) -> str:
    """``text`` as ``folder/name``; its path."""
    path = folder / name
    path.write_text(text)
    return str(path)


def spawns_its_own_rank(pid_file: Path) -> str:
    """A script that, started alone, starts its own second rank the way Lightning's
    ``strategy="ddp"`` does without a launcher (it sets the rank variables in its own
    environment and re-runs itself for rank 1), then trains under DDP; rank 1's pid goes
    to ``pid_file``."""
    return textwrap.dedent(f"""
        import os, socket, subprocess, sys
        import torch, torch.distributed as dist, torch.nn as nn
        if "WORLD_SIZE" not in os.environ:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK="0")
            child = subprocess.Popen([sys.executable, os.path.abspath(sys.argv[0])], env={{**os.environ, "RANK": "1"}})
            open({str(pid_file)!r}, "w").write(str(child.pid))
        dist.init_process_group("gloo")
        model = nn.parallel.DistributedDataParallel(nn.Linear(8, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(30):
            opt.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
    """)

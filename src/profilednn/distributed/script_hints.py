"""What to do when a training framework refuses the launch it was started in, from the
error it raised on a rank: one sentence appended to that rank's reason (``why_failed``).

Lightning reads torchrun's variables under a launch and starts no process of its own, but
checks the launch against the script's ``Trainer(devices=D, num_nodes=M)`` (its
``TorchElasticEnvironment.validate_settings``): a launch of any other number of ranks
raises "You set `devices=D` and `num_nodes=M` in Lightning, but the product (D * M) does
not match the world size (W)". ProfileDNN does not change the script's Trainer, so the
fix is the launch's (or the script's). Lightning's CPU default, ``devices="auto"``, is one
device, which needs no process group: each rank of a launch then trains alone
(``alone_hint``).
"""

from __future__ import annotations

import re

LIGHTNING_WORLD = re.compile(r"You set `devices=(\d+)` and `num_nodes=(\d+)` in Lightning, but the product .*"
                             r"does not match the world size \((\d+)\)")


def launch_hint(error: str) -> str | None:
    """What to do about ``error`` (a rank's first error line) under a launch; None: no advice."""
    found = LIGHTNING_WORLD.search(error)
    if not found:
        return None
    devices, nodes, world = (int(g) for g in found.groups())
    auto = " (devices=\"auto\" on a CPU is 1)" if devices == 1 else ""
    return (f"Lightning checks the launch against the script's Trainer(devices={devices}, num_nodes={nodes}){auto}"
            f": the script runs only on a launch of {devices * nodes} rank(s), not "
            f"{world}. Launch it on {devices} rank(s) per node (scale --ranks {devices}; optimize --nproc-per-node "
            f"{devices}), or let the script's devices follow the launch (e.g. Trainer(devices=int(os.environ.get("
            "\"LOCAL_WORLD_SIZE\", 1)), ...)) to scale it over other rank counts")


def alone_hint(frameworks: list[str], ranks: int) -> str | None:
    """What makes a script built on one of ``frameworks`` (``ddp_watch.TRAINERS``' names)
    train one model across a launch of ``ranks`` ranks on one node; None: no framework's."""
    if "Lightning" in frameworks:
        return (f"The script's Lightning Trainer ran on one device (on a CPU devices=\"auto\" is 1, and one device "
                f"needs no process group): give it Trainer(accelerator=\"cpu\", strategy=\"ddp\", devices={ranks}), "
                "the ranks per node; under the launch it then takes torchrun's ranks and starts no process of its own")
    return None


__all__ = ["LIGHTNING_WORLD", "alone_hint", "launch_hint"]

"""Per-rank wrapper: pin this rank to its cores, set its thread variables, exec the command.

torchrun (or mpirun) starts this file once per rank; it reads the launch plan written
by ``profilednn launch``, applies the rank's CPU affinity with ``os.sched_setaffinity``
(inherited across exec) and its OpenMP/MKL variables, then replaces itself with the
user's command, so the rank keeps this process id and torchrun's signals reach it.

It is run as a script (not ``-m``) and imports only the standard library, so starting a
rank costs no extra package import.
"""

from __future__ import annotations

import json
import os
import sys

PLAN_ENV = "PROFILEDNN_PLAN_FILE"
LOCAL_RANK_VARS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK")
PYTHON_NAMES = ("python", "python3")


def local_rank(env: dict[str, str]) -> int:
    """This rank's index on its node, from torchrun's or the MPI launcher's variables."""
    for name in LOCAL_RANK_VARS:
        if env.get(name, "").strip().isdigit():
            return int(env[name])
    raise SystemExit(f"profilednn rank_entry: none of {', '.join(LOCAL_RANK_VARS)} is set; "
                     "start ranks with `profilednn launch`")


def resolve_command(argv: list[str]) -> list[str]:
    """The user's command with a bare ``python``/``python3`` replaced by this interpreter."""
    if not argv:
        raise SystemExit("profilednn rank_entry: no command to run")
    if argv[0] in PYTHON_NAMES:
        return [sys.executable, *argv[1:]]
    return list(argv)


def apply(plan: dict, rank: int, env: dict[str, str]) -> list[int]:
    """Set ``env`` for rank ``rank`` of ``plan`` and pin this process; returns the CPUs."""
    slots = plan["ranks"]
    if not 0 <= rank < len(slots):
        raise SystemExit(f"profilednn rank_entry: local rank {rank} is outside the plan "
                         f"({len(slots)} ranks per node)")
    slot = slots[rank]
    cpus = [int(c) for c in slot["cpus"]]
    env.update(plan["env"][rank])
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)
    return cpus


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--":
        args = args[1:]
    plan_file = os.environ.get(PLAN_ENV)
    if not plan_file:
        raise SystemExit(f"profilednn rank_entry: {PLAN_ENV} is not set; start ranks with `profilednn launch`")
    with open(plan_file, encoding="utf-8") as fh:
        plan = json.load(fh)
    env = dict(os.environ)
    apply(plan, local_rank(env), env)
    command = resolve_command(args)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        raise SystemExit(f"profilednn rank_entry: cannot run {command[0]!r}: {exc.strerror or exc}") from exc


if __name__ == "__main__":
    main()

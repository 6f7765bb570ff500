"""Per-rank wrapper: pin this rank to its cores, set its variables, point its output at its
log files, exec the command.

torchrun (or mpirun) starts this file once per rank; it reads the launch plan written
by ``profilednn launch``, applies the rank's CPU affinity with ``os.sched_setaffinity``
(inherited across exec) and its variables (OpenMP/MKL threads, allocator preload, ...),
redirects its stdout/stderr to ``<log_dir>/rank<R>[.attempt<N>].{stdout,stderr}.log``
when the plan names a log directory (the launcher relays whole lines from there), then
replaces itself with the user's command (behind ``numactl --membind`` when the plan says
so, which execs it in turn), so the rank keeps this process id and torchrun's signals
reach it. Nothing of this wrapper runs in the rank afterwards: no thread, no handler.

It is run as a script (not ``-m``) and imports only the standard library, so starting a
rank costs no extra package import.
"""

from __future__ import annotations

import json
import os
import sys

PLAN_ENV = "PROFILEDNN_PLAN_FILE"
LOCAL_RANK_VARS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK")
RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
PYTHON_NAMES = ("python", "python3")


def local_rank(env: dict[str, str]) -> int:
    """This rank's index on its node, from torchrun's or the MPI launcher's variables."""
    for name in LOCAL_RANK_VARS:
        if env.get(name, "").strip().isdigit():
            return int(env[name])
    raise SystemExit(f"profilednn rank_entry: none of {', '.join(LOCAL_RANK_VARS)} is set; "
                     "start ranks with `profilednn launch`")


def global_rank(env: dict[str, str], default: int) -> int:
    """This rank's index in the job (torchrun's RANK or the MPI launcher's); ``default`` if unset."""
    for name in RANK_VARS:
        if env.get(name, "").strip().isdigit():
            return int(env[name])
    return default


def redirect_output(log_dir: str, rank: int, attempt: int) -> None:
    """Point fd 1 and 2 at this rank's log files (appended; the launcher relays them)."""
    middle = f".attempt{attempt}" if attempt else ""
    for fd, stream in ((1, "stdout"), (2, "stderr")):
        path = os.path.join(log_dir, f"rank{rank}{middle}.{stream}.log")
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(target, fd)
        os.close(target)


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
    rank = local_rank(env)
    apply(plan, rank, env)
    command = resolve_command(args)
    prefix = (plan.get("prefix") or [[]] * (rank + 1))[rank]
    command = [*prefix, *command]
    sys.stdout.flush()
    sys.stderr.flush()
    if plan.get("log_dir"):
        attempt = env.get("TORCHELASTIC_RESTART_COUNT", "0")
        try:
            redirect_output(plan["log_dir"], global_rank(env, rank), int(attempt) if attempt.isdigit() else 0)
        except OSError as exc:
            raise SystemExit(f"profilednn rank_entry: cannot write the rank's log in {plan['log_dir']}: "
                             f"{exc.strerror or exc}") from exc
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        raise SystemExit(f"profilednn rank_entry: cannot run {command[0]!r}: {exc.strerror or exc}") from exc


if __name__ == "__main__":
    main()

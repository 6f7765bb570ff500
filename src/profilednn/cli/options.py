"""Options shared by the verbs that build a workload (profile, optimize, memory, engines,
train, scale): one declaration each, so names, types and help stay the same everywhere."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

def _checked(check, value):  # noqa: ANN001 - typer callbacks
    """Run an ``outputs`` check while parsing, so a bad value is a usage error at once."""
    from ..errors import ProfileDNNError

    try:
        return check(value)
    except ProfileDNNError as exc:
        raise typer.BadParameter(str(exc)) from None


# Output paths are checked while parsing, before any work; a bad one raises RunError,
# which the CLI prints as one line (exit 1), like any other failure to write.
def writable_dir(value: Optional[Path]) -> Optional[Path]:
    """typer callback: an output directory this process can create or write into."""
    from ..outputs import check_output_dir

    return None if value is None else check_output_dir(value)


def writable_file(value: Optional[Path]) -> Optional[Path]:
    """typer callback: an output file this process can write."""
    from ..outputs import check_output_file

    return None if value is None else check_output_file(value)


def _threads_within_cpus(ctx: typer.Context, value: Optional[int]) -> Optional[int]:
    from ..outputs import check_threads

    over = bool(ctx.params.get("oversubscribe", False))
    return _checked(lambda v: check_threads(v, over), value)


def known_model(value: Optional[str]) -> Optional[str]:
    """typer callback: a built-in workload's name, checked before torch is imported."""
    from ..builtin_workloads import check_workload_name

    return None if value is None else check_workload_name(value)


RunsDir = Annotated[Path, typer.Option("-o", "--output", "--runs-dir", callback=writable_dir,
                                       help="Directory that receives the Run(s).")]
ModelName = Annotated[str, typer.Option("--model", "-m", callback=known_model,
                                         help="Built-in workload (see `profilednn models`).")]
# The same option where a verb also takes something else instead (a script, a Run).
OptionalModelName = Annotated[Optional[str], typer.Option("--model", "-m", callback=known_model,
                                                          help="Built-in workload (see `profilednn models`).")]
BatchSize = Annotated[Optional[int], typer.Option(help="Batch size (workload default if omitted).")]
ImageSize = Annotated[Optional[int], typer.Option(help="Image side for vision models.")]
SeqLen = Annotated[Optional[int], typer.Option(help="Sequence length for language models.")]
NumClasses = Annotated[Optional[int], typer.Option(help="Number of classes (e.g. 91 or 264 for RetinaNet).")]
Threads = Annotated[Optional[int], typer.Option(
    callback=_threads_within_cpus,
    help="Intra-op threads (torch.set_num_threads); at most the CPUs unless --oversubscribe.")]
# Eager, so --threads (checked while parsing) sees it wherever it stands on the line.
Oversubscribe = Annotated[bool, typer.Option(
    "--oversubscribe", is_eager=True,
    help="Allow --threads above the CPU count (the Run notes it; step times suffer).")]
ChannelsLast = Annotated[bool, typer.Option("--channels-last", help="Use channels_last memory format.")]
Dtype = Annotated[str, typer.Option(help="fp32 or bf16 (autocast; loss kept in fp32).")]
Seed = Annotated[int, typer.Option(help="Seed for weights and synthetic data.")]
Wide = Annotated[bool, typer.Option(
    "--wide", help="Full tables: every column at its natural width, whatever the terminal's "
                   "(below 120 columns tables keep the essential columns and wrap cells).")]

# A user's data-parallel script over several nodes (optimize, scale, apply on node rank 0; follow on the others).
NNodes = Annotated[int, typer.Option(
    "--nnodes", help="Nodes the script's jobs span: this verb runs on node rank 0 and `profilednn follow` with the "
                     "same --nnodes/--master-addr/--master-port on each other node mirrors its launches.")]
NodeRank = Annotated[int, typer.Option("--node-rank", help="This node's rank (0: the node that starts every job).")]
MasterAddr = Annotated[Optional[str], typer.Option(
    "--master-addr", help="Address of node rank 0, which hosts the control store (needed with --nnodes > 1).")]
MasterPort = Annotated[Optional[int], typer.Option(
    "--master-port", help="Port of node rank 0's control store (default 29500); each job's rendezvous takes a free "
                          "port node 0 picks.")]
NodeTimeout = Annotated[float, typer.Option(
    "--node-timeout", help="Seconds one node waits for another: to connect, to take up a launch, to send its "
                           "ranks' results.")]

DTYPES = ("fp32", "bf16")


def check_dtype(dtype: str) -> str:
    """``dtype`` when it is one the workloads support, else a usage error."""
    if dtype not in DTYPES:
        raise typer.BadParameter(f"--dtype must be fp32 or bf16, not {dtype!r}")
    return dtype


def command_line(always: bool = False) -> list[str] | None:
    """The command a Run records: ``profilednn ARGS`` when run as the ``profilednn`` program
    (or ``always``), else None (called from Python)."""
    if always or (sys.argv and "profilednn" in sys.argv[0]):
        return ["profilednn", *sys.argv[1:]]
    return None


def size_knobs(**knobs: Any) -> dict[str, Any]:
    """The workload knobs the user gave (None means: the workload's default)."""
    return {k: v for k, v in knobs.items() if v is not None}


__all__ = ["BatchSize", "ChannelsLast", "DTYPES", "Dtype", "ImageSize", "MasterAddr", "MasterPort", "ModelName",
           "NNodes", "NodeRank", "NodeTimeout", "NumClasses", "OptionalModelName", "Oversubscribe", "RunsDir", "SeqLen",
           "Seed", "Threads", "Wide", "check_dtype", "command_line", "known_model", "size_knobs", "writable_dir",
           "writable_file"]

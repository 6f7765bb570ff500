"""Options shared by the verbs that build a workload (profile, optimize, memory, engines,
train, scale): one declaration each, so names, types and help stay the same everywhere."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

RunsDir = Annotated[Path, typer.Option("-o", "--output", "--runs-dir", help="Directory that receives the Run(s).")]
ModelName = Annotated[str, typer.Option("--model", "-m", help="Built-in workload (see `profilednn models`).")]
BatchSize = Annotated[Optional[int], typer.Option(help="Batch size (workload default if omitted).")]
ImageSize = Annotated[Optional[int], typer.Option(help="Image side for vision models.")]
SeqLen = Annotated[Optional[int], typer.Option(help="Sequence length for language models.")]
NumClasses = Annotated[Optional[int], typer.Option(help="Number of classes (e.g. 91 or 264 for RetinaNet).")]
Threads = Annotated[Optional[int], typer.Option(help="Intra-op threads (torch.set_num_threads).")]
ChannelsLast = Annotated[bool, typer.Option("--channels-last", help="Use channels_last memory format.")]
Dtype = Annotated[str, typer.Option(help="fp32 or bf16 (autocast; loss kept in fp32).")]
Seed = Annotated[int, typer.Option(help="Seed for weights and synthetic data.")]

DTYPES = ("fp32", "bf16")


def check_dtype(dtype: str) -> str:
    """``dtype`` when it is one the workloads support, else a usage error."""
    if dtype not in DTYPES:
        raise typer.BadParameter(f"--dtype must be fp32 or bf16, not {dtype!r}")
    return dtype


def size_knobs(**knobs: Any) -> dict[str, Any]:
    """The workload knobs the user gave (None means: the workload's default)."""
    return {k: v for k, v in knobs.items() if v is not None}


__all__ = ["BatchSize", "ChannelsLast", "DTYPES", "Dtype", "ImageSize", "ModelName", "NumClasses",
           "RunsDir", "SeqLen", "Seed", "Threads", "check_dtype", "size_knobs"]

"""``TrainConfig``: what the built-in trainer trains and how; each field's default and help
said once (``profilednn train`` builds its options from them, ``cli/field_options.py``).

Torch-free: the CLI reads it while it starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..option_fields import option


@dataclass
class TrainConfig:
    """What to train and how; batch sizes are per rank (``batch_size``) or global.

    Fields without help take a shared CLI option (``cli/options.py``: ``--image-size``,
    ``--dtype``, ``-o`` ...), which says what they do for every verb.
    """

    model: str = option("small_cnn", flags=("--model", "-m"),
                        help="Built-in workload (see `profilednn models`) or `digits`.")
    batch_size: int | None = option(None, help="Batch size per rank (local batch).")
    global_batch: int | None = option(None, help="Global batch (split over the ranks).")
    image_size: int | None = None
    seq_len: int | None = None
    num_classes: int | None = None
    channels_last: bool = False
    dtype: str = "fp32"
    seed: int = 0
    lr: float | None = option(None, help="Learning rate (models that take one).")
    steps: int | None = option(None, help="Training steps.")
    epochs: int | None = option(None, help="Epochs (digits: passes over the data; others: over the synthetic pool).")
    warmup: int = option(1, help="Steps left out of the timing medians.")
    threads: int | None = option(None, help="Intra-op threads (default: OMP_NUM_THREADS from launch).")
    checkpoint_dir: Path | None = option(None, help="Checkpoint here; resume from the newest one.")
    checkpoint_every: int = option(10, help="Checkpoint every K steps.")
    runs_dir: Path = Path("runs")
    job_id: str | None = option(None, help="Job name (default: launch's job id).")
    capture: bool = option(False, flags=("--capture",),
                           help="Profile a few steps per rank (oneDNN verbose + torch.profiler).")
    capture_steps: int = option(3, help="Steps profiled with --capture.")
    measure_comm: bool = option(True, flags=("--no-comm",), help="Skip the allreduce alpha-beta measurement at the end.")
    backend: str | None = option(None, help="Process-group backend (default: what launch chose, else gloo).")
    pg_timeout: float | None = option(None, help="Seconds a collective may wait for a peer.")
    command: list[str] | None = None  # the command line the rank's Run records


__all__ = ["TrainConfig"]

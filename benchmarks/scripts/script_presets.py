"""What three public training scripts need to run here offline, unmodified (``script_timed.py``).

A preset gets the script's path, a fresh work folder (the script's working directory) and
the script's arguments; it writes the data the script reads (seeded, generated here: no
download), sets what the script's libraries read from the environment, and returns the
arguments to run the script with. None of the scripts is part of ProfileDNN:

- ``chargpt``: karpathy/minGPT's ``projects/chargpt/chargpt.py``; its ``input.txt`` is a
  seeded word stream, its output goes under the work folder.
- ``imagenet``: pytorch/examples' ``imagenet/main.py``; run with ``--dummy`` (torchvision's
  ``FakeData``), it needs nothing prepared.
- ``hf_trainer``: huggingface/transformers' ``examples/pytorch/image-pretraining/run_mae.py``
  (a ``Trainer`` with ``--eval_strategy steps``); its ``imagefolder`` training images are
  seeded random PNGs, the Hugging Face libraries run offline with their cache in the work
  folder. transformers 5 dropped ``transformers.utils.send_example_telemetry``, which the
  4.x examples import: it is supplied as a no-op when missing (telemetry is off offline).
"""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Callable

WORDS = ("the king lord god love death night day heart blood crown sword fair sweet good "
         "noble grace honour time world life soul eyes hand man woman son father mother").split()


def write_text(path: str, chars: int = 200_000) -> None:
    """A seeded, Shakespeare-flavoured word stream: enough characters for chargpt's dataset."""
    rng = random.Random(0)
    out, n = [], 0
    while n < chars:
        line = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 10))).capitalize() + ",\n"
        out.append(line)
        n += len(line)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("O God, O God!\n" + "".join(out))


def chargpt(script: str, work: str, args: list[str]) -> list[str]:
    """minGPT's chargpt: ``input.txt`` in the working directory, minGPT importable."""
    write_text(os.path.join(work, "input.txt"))
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(script))))  # the checkout
    return [f"--system.work_dir='{work}/out'", *args]


def imagenet(script: str, work: str, args: list[str]) -> list[str]:
    """The ImageNet example: ``--dummy`` data is synthetic; a checkpoint would go to ``work``."""
    return list(args)


def write_images(folder: str, count: int = 40, size: int = 64) -> None:
    """``count`` seeded random RGB PNGs in two class folders (an ``imagefolder`` data set)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(count):
        sub = os.path.join(folder, f"class{i % 2}")
        os.makedirs(sub, exist_ok=True)
        pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(os.path.join(sub, f"{i:04d}.png"))


def hf_trainer(script: str, work: str, args: list[str]) -> list[str]:
    """run_mae.py: local images, the Hugging Face libraries offline, output in ``work``."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ[var] = "1"
    os.environ["HF_HOME"] = os.path.join(work, "hf")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    import transformers.utils

    if not hasattr(transformers.utils, "send_example_telemetry"):
        transformers.utils.send_example_telemetry = lambda *a, **k: None  # type: ignore[attr-defined]
    write_images(os.path.join(work, "train"))
    # a glob: datasets resolves data_files as patterns, a bare folder matches no file
    return ["--dataset_name", "imagefolder", "--train_dir", os.path.join(work, "train", "**"),
            "--output_dir", os.path.join(work, "out"), *args]


PRESETS: dict[str, Callable[[str, str, list[str]], list[str]]] = {
    "chargpt": chargpt, "imagenet": imagenet, "hf_trainer": hf_trainer,
}

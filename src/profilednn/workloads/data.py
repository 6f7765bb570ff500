"""Synthetic, seeded training data of the right shapes; nothing is downloaded.

Every function draws from the ``torch.Generator`` it is given, so a pool built from
``torch.Generator().manual_seed(seed)`` is the same on every run with that seed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

POOL_BATCHES = 4  # batches pre-generated per workload; next_batch cycles through them

# BERT's WordPiece vocabulary: special ids, and the first id of an ordinary word piece.
BERT_PAD, BERT_CLS, BERT_SEP, BERT_MASK = 0, 101, 102, 103
BERT_FIRST_WORD_ID = 999
IGNORE_INDEX = -100  # cross_entropy's default ignore_index: positions with no target


def make_pool(
    make_batch: Callable[[torch.Generator], tuple[Any, Any]],
    seed: int,
    batches: int = POOL_BATCHES,
) -> list[tuple[Any, Any]]:
    """Pre-generate ``batches`` (inputs, targets) pairs from one generator seeded with ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    return [make_batch(generator) for _ in range(batches)]


def image_classification_batch(
    generator: torch.Generator, batch_size: int, image_size: int, num_classes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalised-looking images [B, 3, H, W] and integer class labels [B]."""
    images = torch.randn(batch_size, 3, image_size, image_size, generator=generator)
    labels = torch.randint(0, num_classes, (batch_size,), generator=generator)
    return images, labels


def detection_batch(
    generator: torch.Generator,
    batch_size: int,
    image_size: int,
    num_classes: int,
    num_anchors: int,
    positive_fraction: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Images and dense, already-matched RetinaNet targets.

    A real anchor matcher (IoU >= 0.5 with a ground-truth box) leaves a small fraction of
    anchors positive (about 0.1-0.2 % for COCO at 800x800) and the rest background. Here
    ``positive_fraction`` of the anchors per image (at least one) are positive, each with
    one random class and small encoded box deltas; every other anchor is background (an
    all-zero class row). Targets:

    - ``cls_targets`` [B, A, C] float one-hot (the dense tensor the focal loss reads),
    - ``box_targets`` [B, A, 4] encoded deltas (zero on background anchors),
    - ``positive`` [B, A] bool.
    """
    images = torch.randn(batch_size, 3, image_size, image_size, generator=generator)
    cls_targets = torch.zeros(batch_size, num_anchors, num_classes)
    box_targets = torch.zeros(batch_size, num_anchors, 4)
    positive = torch.zeros(batch_size, num_anchors, dtype=torch.bool)
    num_positive = max(1, round(num_anchors * positive_fraction))
    for image in range(batch_size):
        anchors = torch.randperm(num_anchors, generator=generator)[:num_positive]
        classes = torch.randint(0, num_classes, (num_positive,), generator=generator)
        cls_targets[image, anchors, classes] = 1.0
        box_targets[image, anchors] = 0.2 * torch.randn(num_positive, 4, generator=generator)
        positive[image, anchors] = True
    targets = {"cls_targets": cls_targets, "box_targets": box_targets, "positive": positive}
    return images, targets


def masked_lm_batch(
    generator: torch.Generator,
    batch_size: int,
    seq_len: int,
    vocab_size: int,
    mask_fraction: float = 0.15,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT masked-language-model inputs [B, S] and targets [B, S].

    Each sequence is ``[CLS] word ... word [SEP]`` (the specials only when seq_len >= 3).
    ``mask_fraction`` of the word positions (at least one) become prediction targets;
    of those, 80 % are replaced by [MASK], 10 % by a random word and 10 % kept, as in
    BERT. Every other target is IGNORE_INDEX.
    """
    shape = (batch_size, seq_len)
    tokens = torch.randint(BERT_FIRST_WORD_ID, vocab_size, shape, generator=generator)
    first_word, end_word = 0, seq_len
    if seq_len >= 3:
        tokens[:, 0] = BERT_CLS
        tokens[:, -1] = BERT_SEP
        first_word, end_word = 1, seq_len - 1
    words = end_word - first_word
    masked_per_sequence = max(1, round(words * mask_fraction))

    inputs = tokens.clone()
    targets = torch.full_like(tokens, IGNORE_INDEX)
    for row in range(batch_size):
        picked = first_word + torch.randperm(words, generator=generator)[:masked_per_sequence]
        targets[row, picked] = tokens[row, picked]
        roll = torch.rand(masked_per_sequence, generator=generator)
        random_words = torch.randint(
            BERT_FIRST_WORD_ID, vocab_size, (masked_per_sequence,), generator=generator
        )
        kept_or_random = torch.where(roll < 0.9, random_words, tokens[row, picked])
        replaced = torch.where(roll < 0.8, BERT_MASK, kept_or_random)
        inputs[row, picked] = replaced
    return inputs, targets


def language_model_batch(
    generator: torch.Generator, batch_size: int, seq_len: int, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-word prediction: token ids [B, S] and the same stream shifted by one [B, S]."""
    stream = torch.randint(0, vocab_size, (batch_size, seq_len + 1), generator=generator)
    return stream[:, :-1].contiguous(), stream[:, 1:].contiguous()

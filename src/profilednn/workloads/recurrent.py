"""``lstm_lm``: an LSTM word-level language model (the "medium" PTB model of Zaremba et al.).

    token ids [B, S]
      -> embedding (10000 x 650), dropout
      -> 2-layer LSTM, 650 hidden, dropout 0.5 between layers, batch_first
      -> dropout, linear decoder to the vocabulary (optionally tied to the embedding)
      -> logits [B, S, vocab]
    loss = cross-entropy against the inputs shifted by one; SGD lr 1

Each batch starts from a zero hidden state (no state carried across batches) and the
step has no gradient clipping, so the training step stays the plain one every workload
shares; a recipe that clips does so around it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..train_step import TrainStep
from .base import TokenCrossEntropy, WorkloadSpec, finish_workload
from .data import language_model_batch, make_pool

SPEC = WorkloadSpec(
    name="lstm_lm",
    description="2-layer LSTM language model (10000-word vocabulary, 650 hidden, dropout 0.5), SGD",
    family="recurrent",
    item="sequences",
    defaults={
        "batch_size": 20,
        "seq_len": 35,
        "vocab_size": 10000,
        "hidden": 650,
        "layers": 2,
        "dropout": 0.5,
        "tied": False,
        "lr": 1.0,
    },
    knobs=("batch_size", "seq_len", "vocab_size", "hidden", "layers", "dropout", "tied", "lr"),
    ranges={"dropout": (0.0, 0.99)},
)


class LSTMLanguageModel(nn.Module):
    def __init__(
        self, vocab_size: int, hidden: int, layers: int, dropout: float, tied: bool
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, hidden)
        self.dropout = nn.Dropout(dropout)
        between_layers = dropout if layers > 1 else 0.0
        self.lstm = nn.LSTM(hidden, hidden, layers, dropout=between_layers, batch_first=True)
        self.decoder = nn.Linear(hidden, vocab_size)
        nn.init.uniform_(self.embedding.weight, -0.1, 0.1)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        if tied:
            self.decoder.weight = self.embedding.weight

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:  # [B, S] -> [B, S, vocab]
        x = self.dropout(self.embedding(token_ids))
        x, _ = self.lstm(x)  # zero initial state
        return self.decoder(self.dropout(x))


def build(config: dict[str, Any]) -> TrainStep:
    """Build ``lstm_lm`` from a resolved config (torch already seeded)."""
    vocab_size = config["vocab_size"]
    model = LSTMLanguageModel(
        vocab_size, config["hidden"], config["layers"], config["dropout"], config["tied"]
    )
    batches = make_pool(
        lambda g: language_model_batch(g, config["batch_size"], config["seq_len"], vocab_size),
        config["seed"],
    )
    return finish_workload(
        SPEC.name,
        model,
        TokenCrossEntropy(),
        lambda m: torch.optim.SGD(m.parameters(), lr=config["lr"]),
        config,
        batches,
    )

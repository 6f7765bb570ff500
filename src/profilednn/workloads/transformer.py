"""``bert_base``: a BERT-base encoder with a masked-language-model head, built from torch.nn.

    token ids [B, S]
      -> token + position + token-type embeddings, LayerNorm, dropout
      -> N x nn.TransformerEncoderLayer (post-norm, GELU, batch_first)
      -> MLM head: dense, GELU, LayerNorm, decoder tied to the token embedding
      -> logits [B, S, vocab]
    loss = cross-entropy on the masked positions (15 %), AdamW lr 1e-4

BERT-base is hidden 768, 12 layers, 12 heads, FFN 3072 (= 4 x hidden), vocabulary 30522,
512 positions; ``layers``/``hidden``/``heads`` scale it down (FFN stays 4 x hidden).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..errors import WorkloadError
from ..train_step import TrainStep
from .base import TokenCrossEntropy, WorkloadSpec, finish_workload
from .data import IGNORE_INDEX, make_pool, masked_lm_batch

VOCAB_SIZE = 30522
MAX_POSITIONS = 512

SPEC = WorkloadSpec(
    name="bert_base",
    description="BERT-base encoder (torch.nn transformer layers) + masked-LM head, AdamW",
    family="transformer",
    item="sequences",
    defaults={
        "batch_size": 8,
        "seq_len": 128,
        "layers": 12,
        "hidden": 768,
        "heads": 12,
        "lr": 1e-4,
    },
    knobs=("batch_size", "seq_len", "layers", "hidden", "heads", "lr"),
    ranges={"seq_len": (1, MAX_POSITIONS)},
)


class BertForMaskedLM(nn.Module):
    def __init__(
        self,
        vocab_size: int = VOCAB_SIZE,
        hidden: int = 768,
        layers: int = 12,
        heads: int = 12,
        ffn: int = 3072,
        max_positions: int = MAX_POSITIONS,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(vocab_size, hidden)
        self.position_embedding = nn.Embedding(max_positions, hidden)
        self.token_type_embedding = nn.Embedding(2, hidden)
        self.embedding_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.embedding_dropout = nn.Dropout(dropout)
        layer = nn.TransformerEncoderLayer(
            hidden,
            heads,
            dim_feedforward=ffn,
            dropout=dropout,
            activation="gelu",
            layer_norm_eps=1e-12,
            batch_first=True,
            norm_first=False,
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.mlm_dense = nn.Linear(hidden, hidden)
        self.mlm_activation = nn.GELU()
        self.mlm_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.mlm_decoder = nn.Linear(hidden, vocab_size)
        self.mlm_decoder.weight = self.token_embedding.weight  # tied, as in BERT
        self.apply(_init_bert_weights)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:  # [B, S] -> [B, S, vocab]
        positions = torch.arange(token_ids.shape[1], device=token_ids.device)
        x = (
            self.token_embedding(token_ids)
            + self.position_embedding(positions)
            + self.token_type_embedding(torch.zeros_like(token_ids))
        )
        x = self.embedding_dropout(self.embedding_norm(x))
        x = self.encoder(x)  # every position is a real token: no padding mask
        x = self.mlm_norm(self.mlm_activation(self.mlm_dense(x)))
        return self.mlm_decoder(x)


def _init_bert_weights(module: nn.Module) -> None:
    """BERT's initialisation: normal(0, 0.02) weights, zero biases."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
    if isinstance(module, nn.MultiheadAttention):  # its q/k/v projection is a bare Parameter
        nn.init.normal_(module.in_proj_weight, std=0.02)
        nn.init.zeros_(module.in_proj_bias)


def build(config: dict[str, Any]) -> TrainStep:
    """Build ``bert_base`` from a resolved config (torch already seeded)."""
    hidden, heads = config["hidden"], config["heads"]
    if hidden % heads:
        raise WorkloadError(f"bert_base: hidden ({hidden}) must be divisible by heads ({heads})")
    config["ffn"] = 4 * hidden
    config["vocab_size"] = VOCAB_SIZE
    config["max_positions"] = MAX_POSITIONS
    config["mask_fraction"] = 0.15

    model = BertForMaskedLM(
        VOCAB_SIZE, hidden, config["layers"], heads, config["ffn"], MAX_POSITIONS
    )
    batches = make_pool(
        lambda g: masked_lm_batch(
            g, config["batch_size"], config["seq_len"], VOCAB_SIZE, config["mask_fraction"]
        ),
        config["seed"],
    )
    return finish_workload(
        SPEC.name,
        model,
        TokenCrossEntropy(ignore_index=IGNORE_INDEX),
        lambda m: torch.optim.AdamW(m.parameters(), lr=config["lr"], weight_decay=0.01),
        config,
        batches,
    )

"""A small GPT-style causal language model trained on synthetic character-level text, written as
a user would (no ProfileDNN in it): token + position embeddings, pre-LayerNorm blocks with
causal ``F.scaled_dot_product_attention`` and a GELU MLP, tied output head, AdamW, a plain
fp32 loop (``nullcontext()`` where a GPU script would autocast; AdamW without ``fused``).

    python benchmarks/scripts/gpt_train.py --steps 200
"""

import argparse
import math
import time
from contextlib import nullcontext

import torch
from torch import nn
from torch.nn import functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--block-size", type=int, default=128)
parser.add_argument("--n-layer", type=int, default=4)
parser.add_argument("--n-head", type=int, default=4)
parser.add_argument("--n-embd", type=int, default=256)
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--seed", type=int, default=1337)
args = parser.parse_args()


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, block_size: int, n_layer: int, n_head: int, n_embd: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, n_embd)
        self.pos = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab, bias=False)
        self.head.weight = self.tok.weight  # weight tying
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * n_layer))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


torch.manual_seed(args.seed)
# Synthetic "text": a fixed random character sequence with some structure (repeated words).
alphabet = "abcdefghijklmnopqrstuvwxyz .,\n"
words = ["".join(alphabet[int(i)] for i in torch.randint(0, 26, (int(n),))) for n in torch.randint(2, 9, (500,))]
text = " ".join(words[int(i)] for i in torch.randint(0, len(words), (40_000,)))
stoi = {ch: i for i, ch in enumerate(sorted(set(text)))}
data = torch.tensor([stoi[ch] for ch in text], dtype=torch.long)

model = GPT(len(stoi), args.block_size, args.n_layer, args.n_head, args.n_embd)
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
ctx = nullcontext()  # a GPU script would use torch.autocast here; on a CPU it is left out


def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
    ix = torch.randint(len(data) - args.block_size - 1, (args.batch_size,))
    x = torch.stack([data[i:i + args.block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + args.block_size] for i in ix])
    return x, y


model.train()
for step in range(args.steps):
    t0 = time.perf_counter()
    x, y = get_batch()
    with ctx:
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if step % 10 == 0:
        print(f"step {step}: loss {loss.item():.4f}, {1000 * (time.perf_counter() - t0):.0f} ms", flush=True)

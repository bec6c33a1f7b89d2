"""Small reference models shared by the benchmarks and tests (plain PyTorch)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x, cache=None):
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
        if cache is not None:
            if cache.get("k") is not None:
                k = torch.cat([cache["k"], k], dim=2)
                v = torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
        causal = cache is None or t > 1
        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    """A GPT-style causal LM: token + position embeddings, pre-LN blocks, untied head."""

    def __init__(self, vocab: int = 256, d: int = 128, layers: int = 2, heads: int = 4, max_len: int = 128):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_len, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx, caches=None, start: int = 0):
        t = idx.shape[1]
        pos = torch.arange(start, start + t, device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for i, blk in enumerate(self.blocks):
            x = blk(x, None if caches is None else caches[i])
        return self.head(self.ln(x))

    @torch.no_grad()
    def generate(self, idx, new_tokens: int):
        """Greedy decoding with a KV cache that grows by one position per token."""
        caches = [dict() for _ in self.blocks]
        logits = self(idx, caches)
        out = [idx]
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        start = idx.shape[1]
        for _ in range(new_tokens - 1):
            out.append(nxt)
            logits = self(nxt, caches, start)
            start += 1
            nxt = logits[:, -1].argmax(-1, keepdim=True)
        out.append(nxt)
        return torch.cat(out, dim=1)


class MLP(nn.Module):
    def __init__(self, d_in: int = 64, hidden: int = 256, classes: int = 10):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                                 nn.Linear(hidden, classes))

    def forward(self, x):
        return self.net(x)


def cosine_lr(step: int, total: int, base: float = 3e-3) -> float:
    return base * 0.5 * (1 + math.cos(math.pi * step / total))

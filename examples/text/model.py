"""A tiny text encoder with two int64 inputs, as tokenizers hand them over:
``input_ids`` (token ids into an embedding) and ``attention_mask`` (1 for a token, 0 for
padding). One encoder layer (single-head attention with BERT's additive mask
``(1 - mask) * -1e4``, LayerNorm, a GELU MLP) and a head on the masked mean of the tokens
(5 classes). Seeded, not trained: the example carries integer inputs through the chain.
"""

from __future__ import annotations

import torch
from torch import nn

VOCAB, WIDTH, CLASSES = 32, 16, 5


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.pos = nn.Parameter(torch.randn(1, 8, WIDTH) * 0.1)
        self.ln1 = nn.LayerNorm(WIDTH)
        self.q, self.k, self.v = (nn.Linear(WIDTH, WIDTH) for _ in range(3))
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.ln2 = nn.LayerNorm(WIDTH)
        self.fc1, self.fc2 = nn.Linear(WIDTH, 2 * WIDTH), nn.Linear(2 * WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids) + self.pos
        x = self.ln1(h)
        scores = self.q(x) @ self.k(x).transpose(1, 2) * WIDTH**-0.5
        scores = scores + ((1 - attention_mask) * -1e4).unsqueeze(1)
        h = h + self.proj(torch.softmax(scores, dim=-1) @ self.v(x))
        h = h + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(h))))
        keep = attention_mask.unsqueeze(-1)
        return self.head((h * keep).sum(1) / keep.sum(1))


def build(seed: int = 0) -> Encoder:
    """The seeded encoder in eval mode."""
    torch.manual_seed(seed)
    return Encoder().eval()

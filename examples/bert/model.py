"""A BERT sentence encoder of all-MiniLM-L6-v2's shape, random init, with outlier dimensions.

`build()` returns :class:`SentenceEncoder` in eval mode: a ``transformers`` BertModel built
from a :class:`BertConfig` in code (6 layers, hidden 384, 12 heads, intermediate 1536;
nothing downloaded, ``HF_HUB_OFFLINE=1``; the vocabulary of ``examples/bert/vocab.txt``),
fed what its tokenizer gives (``input_ids`` and ``attention_mask``, int64 (N, SEQ)) and
returning the mean of the unpadded tokens' last hidden states, as sentence-transformers
pools them.

The attention mask reaches every attention layer as the original BERT's additive mask,
``(1 - attention_mask) * MASK_VALUE`` (-10000), built by :class:`SentenceEncoder` and handed
to ``BertModel`` in its 4D form (transformers passes a 4D float mask through unchanged; its
own mask builder, ``masking_utils``, indexes a bool mask by ``arange``s, which prepare
refuses: the ops are listed in examples/bert/README.md).

Random init has none of a trained transformer's outlier dimensions, so they are put in,
seeded: trained BERTs carry a few hidden dimensions whose LayerNorm weights and biases are
far larger than the rest, the same dimensions in every layer (Kovaleva et al. 2021, "BERT
Busters: Outlier Dimensions that Disrupt Transformers"; Bondarenko et al. 2021,
"Understanding and Overcoming the Challenges of Efficient Transformer Quantization":
residual-stream values in the hundreds on a few dimensions). Here ``OUTLIER_DIMS``
dimensions (drawn with ``OUTLIER_SEED``) of every layer's output LayerNorm weight and bias
are multiplied by ``OUTLIER_SCALE``.

Such rogue dimensions dominate the cosine of raw embeddings while contributing little to
what the model does (Timkey and van Schijndel 2021, "All Bark and No Bite: Rogue
Dimensions in Transformer Language Models Obscure Representational Quality"), so, as they
recommend, the pooled embedding is standardized per dimension by the linear
``standardizer`` (diagonal weight ``1 / std``, bias ``-mean / std`` of the float model's
embeddings of ``STATS_SAMPLES`` seeded sequences, fixed at build time; a linear model
output stays high precision on the BPU). Without it the output cosine would read the two outlier dimensions only.
"""

from __future__ import annotations

import os

import numpy as np
import torch
from torch import nn

from examples.bert.data import SEQ, VOCAB, split

MASK_VALUE = -10000.0
OUTLIER_DIMS = 2
OUTLIER_SCALE = 3.0
OUTLIER_SEED = 308
STATS_SAMPLES = 64
MINILM = {"layers": 6, "hidden": 384, "heads": 12, "intermediate": 1536}


class SentenceEncoder(nn.Module):
    """BertModel (``input_ids``, BERT's additive mask) -> mean over the unpadded tokens ->
    the per-dimension ``standardizer``."""

    def __init__(self, bert: nn.Module) -> None:
        super().__init__()
        self.bert = bert
        hidden = bert.config.hidden_size
        self.standardizer = nn.Linear(hidden, hidden)
        with torch.no_grad():
            self.standardizer.weight.copy_(torch.eye(hidden))
            self.standardizer.bias.zero_()

    def pooled(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The mean of the unpadded tokens' last hidden states."""
        mask = ((1 - attention_mask) * MASK_VALUE)[:, None, None, :]
        h = self.bert(input_ids=input_ids, attention_mask=mask).last_hidden_state
        keep = attention_mask.unsqueeze(-1)
        return (h * keep).sum(1) / keep.sum(1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.standardizer(self.pooled(input_ids, attention_mask))

    @torch.no_grad()
    def standardize(self, inputs: dict) -> None:
        """Fix the ``standardizer`` (diagonal: ``(e - mean) / std`` per dimension) from
        the pooled embeddings ``e`` of the tokenized ``inputs``."""
        e = self.pooled(*(torch.from_numpy(inputs[k]) for k in ("input_ids", "attention_mask")))
        inv_std = 1.0 / e.std(0).clamp_min(1e-6)
        self.standardizer.weight.copy_(torch.diag(inv_std))
        self.standardizer.bias.copy_(-e.mean(0) * inv_std)


def config(layers: int, hidden: int, heads: int, intermediate: int, seq: int = SEQ):
    """The BertConfig (eager attention: the mask add and softmax show up in the graph)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import BertConfig

    return BertConfig(
        vocab_size=len(VOCAB.read_text().split()), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=intermediate, max_position_embeddings=max(seq, 64),
        attn_implementation="eager",
    )  # fmt: skip


def build(
    layers: int = MINILM["layers"],
    hidden: int = MINILM["hidden"],
    heads: int = MINILM["heads"],
    intermediate: int = MINILM["intermediate"],
    seed: int = 0,
    outlier_scale: float = OUTLIER_SCALE,
) -> SentenceEncoder:
    """The seeded encoder (MiniLM-L6's shape by default) with its outlier dimensions."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import BertModel

    torch.manual_seed(seed)
    bert = BertModel(config(layers, hidden, heads, intermediate), add_pooling_layer=False)
    dims = outlier_dims(hidden)
    with torch.no_grad():
        for layer in bert.encoder.layer:
            norm = layer.output.LayerNorm
            norm.weight[dims] *= outlier_scale
            norm.bias[dims] = norm.weight[dims] * 0.1
    model = SentenceEncoder(bert).eval()
    model.standardize(split(STATS_SAMPLES, OUTLIER_SEED)["inputs"])
    return model


def outlier_dims(hidden: int) -> list[int]:
    """The ``OUTLIER_DIMS`` hidden dimensions given outliers (seeded)."""
    rng = np.random.default_rng(OUTLIER_SEED)
    return sorted(int(d) for d in rng.choice(hidden, OUTLIER_DIMS, replace=False))

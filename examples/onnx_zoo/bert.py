"""A BERT encoder as torch's TorchScript exporter writes it (``dynamo=False``, opset 16).

A small ``transformers`` BertModel (:data:`CONFIG`: 2 layers, hidden 32, 2 heads,
intermediate 64; built in code by :func:`examples.bert.model.config`, random init, seeded,
nothing downloaded), exported with the idioms of that exporter below opset 17: each
LayerNorm written out as ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add, GELU as
``x / sqrt(2) -> Erf -> + 1 -> * x -> * 0.5``, attention as MatMul/Mul/Add mask/Softmax/
MatMul with the heads split by Reshape/Transpose.

The PTQ chain feeds one float input, so :class:`Encoder` takes the word embeddings
``x`` (N, SEQ, hidden) and returns the last hidden state; BertModel adds the position and
token-type embeddings (constant ids, folded by ``original``) and its embedding LayerNorm.
The attention mask is BERT's additive mask, a constant: -10000 on the positions every
sentence of :mod:`examples.bert.data` pads (``MAX_TOKENS`` and beyond), 0 elsewhere.
:class:`MaskedEncoder` (``bert_mask``) takes that mask as a second float input ``mask``
(N, 1, 1, SEQ), each sentence's own (:func:`additive_masks`): two inputs fed by name.
:class:`IdsEncoder` (``bert_ids``) takes the tokenizer's int64 ``input_ids`` instead of the
embeddings (the word embedding a Gather the PTQ chain carries to the .hbm) and the same
float mask; the tokenizer's int64 ``attention_mask`` is not an input: cast to float and
computed on, the PTQ chain refuses it (stages/ptq/feeds.py).
"""

from __future__ import annotations

import io
import os
import warnings
from functools import cache

import numpy as np
import onnx
import torch
from torch import nn

from examples.bert.data import SEQ, split
from stages import libs

CONFIG = {"layers": 2, "hidden": 32, "heads": 2, "intermediate": 64}
MAX_TOKENS = 14
"""The longest sentence of examples/bert/data.py with [CLS] and [SEP]."""
OPSET = 16
"""Below 17: the TorchScript exporter writes LayerNorm decomposed (and Gelu below 20)."""


class Encoder(nn.Module):
    """Word embeddings -> BertModel (constant position / token-type ids and mask) -> last
    hidden state."""

    def __init__(self, bert: nn.Module) -> None:
        super().__init__()
        self.bert = bert
        mask = torch.zeros(1, 1, 1, SEQ)
        mask[..., MAX_TOKENS:] = -10000.0
        self.register_buffer("mask", mask)
        self.register_buffer("positions", torch.arange(SEQ)[None])
        self.register_buffer("token_types", torch.zeros(1, SEQ, dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bert(inputs_embeds=x, attention_mask=self.mask, position_ids=self.positions,
                        token_type_ids=self.token_types)  # fmt: skip
        return out.last_hidden_state


class MaskedEncoder(Encoder):
    """:class:`Encoder` whose additive attention mask is the second input."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out = self.bert(inputs_embeds=x, attention_mask=mask, position_ids=self.positions,
                        token_type_ids=self.token_types)  # fmt: skip
        return out.last_hidden_state


class IdsEncoder(Encoder):
    """:class:`Encoder` fed the tokenizer's int64 ``input_ids`` (its word embedding a Gather
    of the table) and the additive float mask."""

    def forward(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out = self.bert(input_ids=input_ids, attention_mask=mask, position_ids=self.positions,
                        token_type_ids=self.token_types)  # fmt: skip
        return out.last_hidden_state


@cache
def encoder(seed: int = 0) -> Encoder:
    """The seeded encoder of :data:`CONFIG` (eval mode), through :func:`stages.libs.call`:
    transformers imports torchvision on the first use of BertModel."""
    return libs.call(_encoder, seed)


def _encoder(seed: int) -> Encoder:
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import BertModel

    from examples.bert.model import config

    torch.manual_seed(seed)
    bert = BertModel(config(*CONFIG.values()), add_pooling_layer=False)
    return Encoder(bert).eval()


def bert() -> onnx.ModelProto:
    """The encoder through ``torch.onnx.export(dynamo=False)`` at :data:`OPSET`."""
    return _export(encoder(), {"x": torch.zeros(1, SEQ, CONFIG["hidden"])})


def bert_mask() -> onnx.ModelProto:
    """The encoder with the additive mask as input ``mask``, exported the same way."""
    masked = MaskedEncoder(encoder().bert).eval()
    xs = {"x": torch.zeros(1, SEQ, CONFIG["hidden"]), "mask": torch.zeros(1, 1, 1, SEQ)}
    return _export(masked, xs)


def bert_ids() -> onnx.ModelProto:
    """The encoder fed int64 ``input_ids`` and the float ``mask``, exported the same way."""
    ids = IdsEncoder(encoder().bert).eval()
    xs = {"input_ids": torch.zeros(1, SEQ, dtype=torch.long), "mask": torch.zeros(1, 1, 1, SEQ)}
    return _export(ids, xs)


def _export(model: nn.Module, xs: dict[str, torch.Tensor]) -> onnx.ModelProto:
    f = io.BytesIO()
    axes = {k: {0: "N"} for k in [*xs, "y"]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, tuple(xs.values()), f, dynamo=False, opset_version=OPSET,
                          input_names=list(xs), output_names=["y"], dynamic_axes=axes)  # fmt: skip
    return onnx.load_from_string(f.getvalue())


def additive_masks(n: int, seed: int) -> np.ndarray:
    """BERT's additive masks (N, 1, 1, SEQ) of the same sentences: 0 on tokens, -10000 on
    padding."""
    mask = split(n, seed)["inputs"]["attention_mask"].astype(np.float32)
    return ((1.0 - mask) * -10000.0)[:, None, None, :]


def token_ids(n: int, seed: int) -> np.ndarray:
    """The tokenizer's int64 ``input_ids`` (N, SEQ) of ``n`` sentences (seeded)."""
    return split(n, seed)["inputs"]["input_ids"].astype(np.int64)


def embeddings(n: int, seed: int) -> np.ndarray:
    """The word embeddings (N, SEQ, hidden) of ``n`` tokenized sentences (seeded)."""
    ids = torch.from_numpy(split(n, seed)["inputs"]["input_ids"])
    with torch.no_grad():
        return encoder().bert.embeddings.word_embeddings(ids).numpy().astype(np.float32)

"""Tokenized sentences for the BERT example: ``input_ids`` and ``attention_mask`` (int64,
(N, SEQ)), as ``transformers``' ``BertTokenizer`` hands them over; no labels.

The sentences are made from a small English grammar, seeded (subject, verb, object, and
sometimes an adjective and a place), so their lengths vary and the padding does too: 8 to
14 tokens with ``[CLS]`` and ``[SEP]``, padded to ``SEQ``. The tokenizer is the field's own
``BertTokenizer`` on the bundled ``vocab.txt`` (the grammar's words, their ``##s`` /
``##ed`` / ``##ing`` word pieces and BERT's special tokens; :func:`vocab_lines` lists it),
so plural and past forms split into word pieces as a real WordPiece vocabulary splits them.
Without labels every stage is scored by its agreement with the float model (output
cosine, the primary metric of an unlabelled run).
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

import numpy as np

SEQ = 16
VOCAB = Path(__file__).with_name("vocab.txt")
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
SUBJECTS = ["the", "a", "my", "our", "their", "this"]
NOUNS = [
    "cat",
    "dog",
    "bird",
    "model",
    "chip",
    "board",
    "engineer",
    "team",
    "camera",
    "network",
    "layer",
    "sensor",
]
VERBS = [
    "run",
    "train",
    "watch",
    "compile",
    "measure",
    "quantize",
    "check",
    "move",
    "read",
    "build",
]
ADJECTIVES = ["small", "large", "quiet", "fast", "slow", "new", "old", "bright"]
PLACES = ["in the lab", "on the board", "at night", "near the door", "after lunch"]
SUFFIXES = ["##s", "##ed", "##ing"]


def vocab_lines() -> list[str]:
    """The vocabulary, one token per line: specials, then every word, then the pieces."""
    words = {w for p in PLACES for w in p.split()} | set(SUBJECTS + NOUNS + VERBS + ADJECTIVES)
    return SPECIALS + sorted(words) + SUFFIXES + [".", ","]


@cache
def tokenizer():
    """``transformers.BertTokenizer`` on the bundled vocabulary (nothing downloaded)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import BertTokenizer

    tokens = VOCAB.read_text().split()
    return BertTokenizer(vocab={t: i for i, t in enumerate(tokens)}, do_lower_case=True)


def sentences(n: int, seed: int) -> list[str]:
    """``n`` seeded sentences of the grammar (plural nouns and past/-ing verbs included)."""
    rng = np.random.default_rng(seed)

    def pick(words: list[str]) -> str:
        return words[int(rng.integers(len(words)))]

    out = []
    for _ in range(n):
        noun = pick(NOUNS) + ("s" if rng.random() < 0.3 else "")
        verb = pick(VERBS) + pick(["s", "ed", "ing", ""])
        words = [pick(SUBJECTS), noun, verb, pick(SUBJECTS)]
        if rng.random() < 0.5:
            words.append(pick(ADJECTIVES))
        words.append(pick(NOUNS))
        if rng.random() < 0.4:
            words.append(pick(PLACES))
        out.append(" ".join(words) + ".")
    return out


def split(n: int, seed: int) -> dict:
    """A split of ``n`` tokenized sentences: int64 ids and mask, padded to ``SEQ``."""
    enc = tokenizer()(
        sentences(n, seed), padding="max_length", truncation=True, max_length=SEQ,
        return_tensors="np",
    )  # fmt: skip
    inputs = {k: enc[k].astype(np.int64) for k in ("input_ids", "attention_mask")}
    return {"inputs": inputs, "labels": None}


def load() -> dict:
    """128 calibration and 256 evaluation sentences (the spec's counts cut them)."""
    return {"train": split(128, 1), "evaluation": split(256, 2)}


def small() -> dict:
    """Fewer sentences: the test's reduced run."""
    return {"train": split(16, 1), "evaluation": split(8, 2)}

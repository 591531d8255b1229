"""``examples.onnx_zoo.data:<name>``: photo crops for a graph, without labels.

Crops of scikit-learn's two sample photographs (examples/zoo/images.py) at the graph's
input size, NHWC for the tf2onnx graph; for ``bert`` the word embeddings of examples/bert/data.py's
tokenized sentences (:func:`examples.onnx_zoo.bert.embeddings`), for ``bert_mask`` those
and each sentence's additive attention mask (two named inputs), for ``bert_ids`` the int64
token ids and that mask; no labels: every stage is judged by its agreement
with the original float model (output cosine).
"""

from __future__ import annotations

from examples.onnx_zoo.graphs import BUILDERS, SIZE
from examples.zoo import images

CALIBRATION, EVALUATION = 64, 32


def dataset(name: str) -> dict:
    if name.startswith("bert"):
        from examples.onnx_zoo.bert import additive_masks, embeddings, token_ids

        n = CALIBRATION + EVALUATION
        inputs = {"input_ids": token_ids(n, 7)} if name == "bert_ids" else {"x": embeddings(n, 7)}
        if name != "bert":
            inputs["mask"] = additive_masks(n, seed=7)
        return _splits(inputs)
    x = images.crops(CALIBRATION + EVALUATION, SIZE, seed=7)
    if name == "tf_nhwc":
        x = x.transpose(0, 2, 3, 1).copy()
    return _splits({"x": x})


def _splits(inputs: dict) -> dict:
    return {
        "train": {"inputs": {k: v[:CALIBRATION] for k, v in inputs.items()}, "labels": None},
        "evaluation": {"inputs": {k: v[CALIBRATION:] for k, v in inputs.items()},
                       "labels": None},
    }  # fmt: skip


def __getattr__(attr: str):
    if attr not in BUILDERS:
        raise AttributeError(f"no ONNX zoo graph {attr!r}; there are {sorted(BUILDERS)}")
    return lambda: dataset(attr)

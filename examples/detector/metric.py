"""``data.metric`` of the detector: mAP@0.5 of a stage's detections against the float
model's, decoded from all twelve raw maps as SSD's post-processing decodes them.

Decoding (torchvision's ``SSD.postprocess_detections``, done here in numpy/torch so it can
run on any stage's outputs): each map ``(N, A*K, H, W)`` is viewed as ``(N, H*W*A, K)``
(the head's own layout), the scales concatenated; class scores are the softmax over the
``C`` classes (column 0 the background, dropped); boxes are the anchors of the model's
``DefaultBoxGenerator`` moved by ``SSD.box_coder``. Per image the ``CANDIDATES`` best
(anchor, class) scores are kept, greedy NMS at IoU ``NMS_IOU`` per class, and the top
``DETECTIONS`` remain.

The float model's detections are the ground truth (the model is untrained: what matters is
whether the board finds the same boxes). AP per class is the area under the
precision/recall curve of the stage's detections ranked by score, a detection matching an
unmatched float box of its class at IoU >= 0.5 (VOC's all-point AP); mAP is the mean over
the classes the float detections hold.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import torch

from examples.detector.model import CLASSES, SIZE, ssdlite

CANDIDATES, NMS_IOU, DETECTIONS, MATCH_IOU = 200, 0.5, 20, 0.5


def map50(outputs: dict, reference: dict, labels) -> dict[str, float]:
    """{"map50": mAP@0.5 of ``outputs``' detections against ``reference``'s}."""
    got, want = detections(outputs), detections(reference)
    aps = [_ap(got, want, c) for c in sorted({int(c) for _, _, c, _ in want})]
    return {"map50": float(np.mean(aps)) if aps else 1.0}


def detections(outputs: dict) -> list[tuple[int, np.ndarray, int, float]]:
    """(image, box xyxy, class, score) of every image's kept detections."""
    scores = _flat(outputs, "scores", CLASSES)
    deltas = _flat(outputs, "boxes", 4)
    probs = torch.softmax(torch.from_numpy(scores), -1)[..., 1:].numpy()
    out = []
    for i in range(len(probs)):
        boxes = _ssd().box_coder.decode_single(torch.from_numpy(deltas[i]), anchors()).numpy()
        out += [(i, *d) for d in _image(boxes, probs[i])]
    return out


def _flat(outputs: dict, kind: str, columns: int) -> np.ndarray:
    maps = [np.asarray(outputs[f"output.{kind}.{k}"], np.float32) for k in range(6)]
    flat = []
    for m in maps:
        n, _, h, w = m.shape
        flat.append(
            m.reshape(n, -1, columns, h, w).transpose(0, 3, 4, 1, 2).reshape(n, -1, columns)
        )
    return np.concatenate(flat, 1)


def _image(boxes: np.ndarray, probs: np.ndarray) -> list[tuple[np.ndarray, int, float]]:
    """The image's detections: best candidates, NMS per class, the top ``DETECTIONS``."""
    flat = np.argsort(-probs, axis=None, kind="stable")[:CANDIDATES]
    anchor, cls = np.unravel_index(flat, probs.shape)
    kept = []
    for a, c in zip(anchor, cls, strict=True):
        same = [b for b, k, _ in kept if k == c + 1]
        if all(_iou(boxes[a], b) < NMS_IOU for b in same):
            kept.append((boxes[a], int(c) + 1, float(probs[a, c])))
    return kept[:DETECTIONS]


def _ap(got: list, want: list, cls: int) -> float:
    """VOC all-point AP of class ``cls`` (module docstring)."""
    truth = [(i, b) for i, b, c, _ in want if c == cls]
    preds = sorted((d for d in got if d[2] == cls), key=lambda d: -d[3])
    used, hits = set(), []
    for i, box, _, _ in preds:
        ious = [(_iou(box, b), k) for k, (j, b) in enumerate(truth) if j == i and k not in used]
        best = max(ious, default=(0.0, -1))
        hits.append(best[0] >= MATCH_IOU)
        if hits[-1]:
            used.add(best[1])
    tp = np.cumsum(hits)
    recall = np.concatenate([[0.0], tp / len(truth)])
    precision = np.concatenate([[1.0], tp / np.arange(1, len(hits) + 1)])
    precision = np.maximum.accumulate(precision[::-1])[::-1]
    return float(np.sum(np.diff(recall) * precision[1:]))


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return float(inter / union) if union > 0 else 0.0


@cache
def _ssd():
    return ssdlite()


@cache
def anchors() -> torch.Tensor:
    """The model's default boxes (xyxy, pixels) for a ``SIZE`` input, all scales."""
    ssd = _ssd()
    image_list = ssd.transform(torch.zeros(1, 3, SIZE, SIZE).unbind(0))[0]
    features = list(ssd.backbone(image_list.tensors).values())
    return ssd.anchor_generator(image_list, features)[0]

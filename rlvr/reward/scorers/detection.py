"""Object-detection scorer: boxes parsed from the answer text, IoU matching, COCO mAP (pycocotools).

Answer text: the part inside ``<answer>...</answer>`` if present, else the text after ``</think>``,
else the whole response. Accepted box formats, boxes as ``[x1, y1, x2, y2]`` in pixels:

* JSON — a list of objects ``{"bbox_2d" | "bbox" | "box": [x1, y1, x2, y2], "label": "cat", "score": 0.9}``
  (label and score optional), or a single such object;
* plain lists — every ``[x1, y1, x2, y2]`` of four numbers in the text (no labels).

Ground truth: a list of ``{"bbox": [x1, y1, x2, y2], "label": ...}`` (or ``bbox_2d``/``box``) or of bare
boxes, or the same as a JSON string. Boxes without a label match boxes of any label.

Scores:

* ``format`` — 1.0 when the answer parses and every box is well formed (4 finite numbers,
  ``x1 < x2`` and ``y1 < y2``); an empty JSON list is well formed;
* ``map`` / ``map50`` — COCO AP averaged over IoU 0.50:0.95 / at IoU 0.50, by
  ``pycocotools.cocoeval.COCOeval`` on the one image (predictions without a score are ranked in
  answer order); as in COCO, a label that is not in the ground truth is not evaluated;
* ``f1`` — greedy IoU matching: pairs with compatible labels sorted by IoU (highest first), each box
  used at most once, a pair counts when IoU >= ``iou_threshold``; F1 of precision and recall.

Empty ground truth: accuracy 1.0 for an empty prediction and 0.0 otherwise.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
from dataclasses import dataclass

from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from rlvr.utils.errors import RewardError

_BOX_KEYS = ("bbox_2d", "bbox", "box")
_PLAIN_BOX = re.compile(r"\[\s*(-?\d+(?:\.\d+)?)\s*,\s*(-?\d+(?:\.\d+)?)\s*,\s*(-?\d+(?:\.\d+)?)\s*,\s*(-?\d+(?:\.\d+)?)\s*\]")
ACCURACY_METRICS = ("map", "map50", "f1")


@dataclass
class Box:
    """One box ``[x1, y1, x2, y2]`` with an optional label and confidence."""

    xyxy: tuple[float, float, float, float]
    label: str | None = None
    score: float | None = None

    @property
    def valid(self) -> bool:
        x1, y1, x2, y2 = self.xyxy
        return all(math.isfinite(v) for v in self.xyxy) and x1 < x2 and y1 < y2


def answer_region(text: str) -> str:
    """The answer part of a response (see module docstring)."""
    tagged = re.findall(r"<answer>(.*?)</answer>", text, flags=re.DOTALL)
    if tagged:
        return tagged[-1]
    return text.split("</think>")[-1]


def _box_from_obj(obj: object) -> Box | None:
    if isinstance(obj, (list, tuple)) and len(obj) == 4:
        raw, label, score = obj, None, None
    elif isinstance(obj, dict):
        raw = next((obj[k] for k in _BOX_KEYS if k in obj), None)
        label, score = obj.get("label"), obj.get("score", obj.get("confidence"))
    else:
        return None
    try:
        xyxy = tuple(float(v) for v in raw)
        score = None if score is None else float(score)
    except (TypeError, ValueError):
        return None
    if len(xyxy) != 4:
        return None
    return Box(xyxy, None if label is None else str(label), score)


def _parse_json(text: str) -> list[Box | None] | None:
    stripped = re.sub(r"^```(?:json)?\s*|\s*```$", "", text.strip())
    start = min((i for i in (stripped.find("["), stripped.find("{")) if i >= 0), default=-1)
    if start < 0:
        return None
    try:
        data, _ = json.JSONDecoder().raw_decode(stripped[start:])
    except json.JSONDecodeError:
        return None
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or (data and all(isinstance(v, (int, float)) for v in data)):
        return None  # bare number lists are read by the plain-list pattern, which finds all of them
    return [_box_from_obj(item) for item in data]


def parse_boxes(text: str) -> tuple[list[Box], bool]:
    """``(boxes, well_formed)`` of a response's answer; malformed entries are dropped."""
    region = answer_region(text)
    parsed = _parse_json(region)
    if parsed is None:
        parsed = [Box(tuple(float(v) for v in m)) for m in _PLAIN_BOX.findall(region)]
        if not parsed:
            return [], False
    boxes = [b for b in parsed if b is not None and b.valid]
    return boxes, len(boxes) == len(parsed)


def parse_ground_truth(ground_truth: list | dict | str) -> list[Box]:
    """Ground-truth boxes; raises :class:`RewardError` for a malformed one."""
    if isinstance(ground_truth, str):
        try:
            ground_truth = json.loads(ground_truth)
        except json.JSONDecodeError as exc:
            raise RewardError(f"detection ground truth is not valid JSON ({exc}): {ground_truth[:200]!r}") from exc
    items = [ground_truth] if isinstance(ground_truth, dict) else list(ground_truth)
    if items and all(isinstance(v, (int, float)) for v in items):
        items = [items]
    boxes = [_box_from_obj(item) for item in items]
    if any(b is None or not b.valid for b in boxes):
        raise RewardError(f"detection ground truth has a malformed box (want [x1, y1, x2, y2], x1<x2, y1<y2): {items!r}")
    return boxes


def iou(a: Box, b: Box) -> float:
    """Intersection over union of two boxes."""
    ax1, ay1, ax2, ay2 = a.xyxy
    bx1, by1, bx2, by2 = b.xyxy
    inter = max(0.0, min(ax2, bx2) - max(ax1, bx1)) * max(0.0, min(ay2, by2) - max(ay1, by1))
    union = (ax2 - ax1) * (ay2 - ay1) + (bx2 - bx1) * (by2 - by1) - inter
    return inter / union if union > 0 else 0.0


def _labels_match(pred: Box, gt: Box) -> bool:
    return pred.label is None or gt.label is None or pred.label.strip().lower() == gt.label.strip().lower()


def greedy_match(preds: list[Box], gts: list[Box], iou_threshold: float) -> list[tuple[int, int, float]]:
    """Greedy one-to-one matching by descending IoU; returns ``(pred_index, gt_index, iou)`` pairs."""
    pairs = sorted(
        ((iou(p, g), i, j) for i, p in enumerate(preds) for j, g in enumerate(gts) if _labels_match(p, g)),
        key=lambda t: (-t[0], t[1], t[2]),  # ties: lower prediction index, then lower ground-truth index
    )
    used_p, used_g, matches = set(), set(), []
    for value, i, j in pairs:
        if value < iou_threshold:
            break
        if i not in used_p and j not in used_g:
            used_p.add(i)
            used_g.add(j)
            matches.append((i, j, value))
    return matches


def f1_score(preds: list[Box], gts: list[Box], iou_threshold: float = 0.5) -> float:
    """F1 of greedy IoU matches (see module docstring)."""
    if not gts:
        return float(not preds)
    matched = len(greedy_match(preds, gts, iou_threshold))
    if matched == 0:
        return 0.0
    precision, recall = matched / len(preds), matched / len(gts)
    return 2 * precision * recall / (precision + recall)


def coco_map(preds_per_image: list[list[Box]], gts_per_image: list[list[Box]]) -> tuple[float, float]:
    """``(mAP@[.5:.95], AP@.5)`` of COCOeval over the images; labels ``None`` form one class."""
    names = sorted({str(b.label) for boxes in (*gts_per_image, *preds_per_image) for b in boxes})
    cat = {name: k + 1 for k, name in enumerate(names)}
    annotations, detections = [], []
    for image_id, (preds, gts) in enumerate(zip(preds_per_image, gts_per_image, strict=True), start=1):
        for g in gts:
            x1, y1, x2, y2 = g.xyxy
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": cat[str(g.label)],
                                "bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1), "iscrowd": 0})
        for rank, p in enumerate(preds):
            x1, y1, x2, y2 = p.xyxy
            detections.append({"image_id": image_id, "category_id": cat[str(p.label)], "bbox": [x1, y1, x2 - x1, y2 - y1],
                               "score": p.score if p.score is not None else 1.0 - rank * 1e-3})
    if not annotations:
        return (float(not detections),) * 2
    if not detections:
        return 0.0, 0.0
    with contextlib.redirect_stdout(io.StringIO()):
        coco_gt = COCO()
        coco_gt.dataset = {"images": [{"id": i} for i in range(1, len(gts_per_image) + 1)],
                           "annotations": annotations, "categories": [{"id": v, "name": k} for k, v in cat.items()]}
        coco_gt.createIndex()
        evaluator = COCOeval(coco_gt, coco_gt.loadRes(detections), "bbox")
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return max(float(evaluator.stats[0]), 0.0), max(float(evaluator.stats[1]), 0.0)


def compute_score(solution_str: str, ground_truth: list | dict | str, accuracy_metric: str = "map",
                  format_weight: float = 0.2, accuracy_weight: float = 0.8, iou_threshold: float = 0.5) -> dict:
    """``{"score", "format", "accuracy"}`` with ``score = format_weight * format + accuracy_weight * accuracy``."""
    if accuracy_metric not in ACCURACY_METRICS:
        raise RewardError(f"detection accuracy_metric must be one of {ACCURACY_METRICS}, got {accuracy_metric!r}")
    gts = parse_ground_truth(ground_truth)
    preds, well_formed = parse_boxes(solution_str)
    if accuracy_metric == "f1":
        accuracy = f1_score(preds, gts, iou_threshold)
    else:
        ap, ap50 = coco_map([preds], [gts])
        accuracy = ap if accuracy_metric == "map" else ap50
    fmt = float(well_formed)
    return {"score": format_weight * fmt + accuracy_weight * accuracy, "format": fmt, "accuracy": accuracy}

"""``DetectionRewardWorker``: visual grounding / detection answers scored by IoU and COCO mAP."""

from __future__ import annotations

from typing import Any

from rlvr.protocol import DataProto
from rlvr.reward.config import DetectionRewardConfig
from rlvr.reward.scorers.detection import ACCURACY_METRICS, coco_map, compute_score, parse_boxes, parse_ground_truth
from rlvr.reward.workers.base import RuleRewardWorker, ScoredBatch
from rlvr.reward.workers.registry import register_reward_worker
from rlvr.utils.errors import ConfigError


@register_reward_worker("detection", DetectionRewardConfig)
class DetectionRewardWorker(RuleRewardWorker):
    """Reward = ``format_weight * format + accuracy_weight * accuracy`` per sample (see
    :mod:`rlvr.reward.scorers.detection` for parsing, greedy IoU matching and pycocotools mAP);
    ``scores`` = the accuracy. Metrics: ``reward/detection/{format,accuracy}`` per sample and
    ``reward/detection/batch_map`` (COCO mAP@[.5:.95] over all images of the batch).
    """

    metric_prefix = "detection"

    def __init__(self, worker_config: DetectionRewardConfig) -> None:
        if worker_config.accuracy_metric not in ACCURACY_METRICS:
            raise ConfigError("accuracy_metric", f"must be one of {ACCURACY_METRICS}, got {worker_config.accuracy_metric!r}")
        super().__init__(worker_config)

    def score(self, responses: list[str], truths: list[Any], data: DataProto) -> ScoredBatch:
        config: DetectionRewardConfig = self.worker_config
        results = [
            compute_score(r, t, config.accuracy_metric, config.format_weight, config.accuracy_weight, config.iou_threshold)
            for r, t in zip(responses, truths)
        ]
        batch_map, _ = coco_map([parse_boxes(r)[0] for r in responses], [parse_ground_truth(t) for t in truths])
        metrics = {
            "format": [r["format"] for r in results],
            "accuracy": [r["accuracy"] for r in results],
            "batch_map": [batch_map] * len(results),
        }
        return ScoredBatch([r["score"] for r in results], [r["accuracy"] for r in results], metrics)

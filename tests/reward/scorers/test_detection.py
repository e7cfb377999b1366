"""Detection scorer: parsing, IoU, greedy matching, COCO mAP through pycocotools."""

import pytest

from rlvr.utils.errors import RewardError
from rlvr.reward.scorers.detection import Box, coco_map, compute_score, f1_score, greedy_match, iou, parse_boxes

GT = [{"bbox": [0, 0, 100, 100], "label": "cat"}]


def test_iou_hand_values():
    assert iou(Box((0, 0, 10, 10)), Box((5, 0, 15, 10))) == pytest.approx(1 / 3)
    assert iou(Box((0, 0, 10, 10)), Box((20, 20, 30, 30))) == 0.0
    assert iou(Box((0, 0, 100, 100)), Box((0, 0, 100, 72))) == pytest.approx(0.72)


def test_parse_json_plain_lists_and_answer_tags():
    boxes, ok = parse_boxes('<think>[1, 1, 2, 2]</think><answer>[{"bbox_2d": [1, 2, 3, 4], "label": "dog", "score": 0.5}]</answer>')
    assert ok and boxes == [Box((1.0, 2.0, 3.0, 4.0), "dog", 0.5)]
    boxes, ok = parse_boxes("The objects are at [0, 0, 5, 5] and [10.5, 10, 20, 20].")
    assert ok and [b.xyxy for b in boxes] == [(0, 0, 5, 5), (10.5, 10, 20, 20)]
    boxes, ok = parse_boxes('```json\n[{"bbox": [5, 5, 1, 1]}, {"bbox": [0, 0, 2, 2]}]\n```')
    assert not ok and [b.xyxy for b in boxes] == [(0, 0, 2, 2)]  # inverted box dropped, format fails
    assert parse_boxes("I see a cat.") == ([], False)
    assert parse_boxes("[]") == ([], True)


def test_greedy_matching_and_f1():
    gts = [Box((0, 0, 10, 10), "a"), Box((20, 0, 30, 10), "a")]
    preds = [Box((0, 0, 10, 9), "a"), Box((21, 0, 30, 10), "a"), Box((50, 50, 60, 60), "a")]
    assert [(i, j) for i, j, _ in greedy_match(preds, gts, 0.5)] == [(0, 0), (1, 1)]
    assert f1_score(preds, gts) == pytest.approx(0.8)  # P = 2/3, R = 1
    assert f1_score([Box((0, 0, 10, 10), "b")], gts[:1]) == 0.0  # label mismatch
    assert f1_score([], []) == 1.0 and f1_score([preds[0]], []) == 0.0


def test_coco_map_hand_values():
    gt = [Box((0, 0, 100, 100), "cat")]
    assert coco_map([[Box((0, 0, 100, 100), "cat")]], [gt]) == pytest.approx((1.0, 1.0))
    # IoU 0.72 passes the thresholds 0.50 ... 0.70: 5 of 10
    assert coco_map([[Box((0, 0, 100, 72), "cat")]], [gt]) == pytest.approx((0.5, 1.0))
    assert coco_map([[Box((0, 0, 100, 100), "dog")]], [gt]) == (0.0, 0.0)
    assert coco_map([[]], [gt]) == (0.0, 0.0)


def test_compute_score_weights_format_and_accuracy():
    perfect = '[{"bbox_2d": [0, 0, 100, 100], "label": "cat"}]'
    assert compute_score(perfect, GT) == pytest.approx({"score": 1.0, "format": 1.0, "accuracy": 1.0})
    partial = compute_score('[{"bbox_2d": [0, 0, 100, 72], "label": "cat"}]', GT)
    assert partial == pytest.approx({"score": 0.2 + 0.8 * 0.5, "format": 1.0, "accuracy": 0.5})
    assert compute_score("no boxes", GT) == {"score": 0.0, "format": 0.0, "accuracy": 0.0}
    f1 = compute_score("[0, 0, 100, 100] [200, 200, 300, 300]", '[[0, 0, 100, 100]]', accuracy_metric="f1",
                       format_weight=0.5, accuracy_weight=0.5)
    assert f1 == pytest.approx({"score": 0.5 + 0.5 * (2 / 3), "format": 1.0, "accuracy": 2 / 3})


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(RewardError, match="accuracy_metric"):
        compute_score("[]", GT, accuracy_metric="ap")
    with pytest.raises(RewardError, match="malformed box"):
        compute_score("[]", [[10, 10, 0, 0]])

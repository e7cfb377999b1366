"""Rule reward workers: math, general QA, CrossThinkQA, boxed multiple choice, IFEval, detection."""

import pytest
import torch
from reward_worker_batch import build_batch, last_token_index

from rlvr.utils.errors import ConfigError, RewardError
from rlvr.reward.workers import (
    CrossThinkQARuleRewardConfig,
    CrossThinkQARuleRewardWorker,
    DetectionRewardConfig,
    DetectionRewardWorker,
    GeneralRuleRewardConfig,
    GeneralRuleRewardWorker,
    GeneralValRuleRewardConfig,
    GeneralValRuleRewardWorker,
    MathRuleRewardConfig,
    MathRuleRewardWorker,
    MultipleChoiceBoxedRuleRewardConfig,
    MultipleChoiceBoxedRuleRewardWorker,
)
from rlvr.reward.contract import check_worker_output


def _run(worker, data):
    worker.initialize(None)
    out = worker.compute_rewards(data)
    batch_size, response_len = data.batch["responses"].shape
    tensors = check_worker_output(out, batch_size, response_len, type(worker).__name__)
    assert all(out.batch[k].dtype == torch.float32 for k in tensors)
    rewards = out.batch["response_level_rewards"]
    token = out.batch["token_level_rewards"]
    expected_token = torch.zeros_like(token)
    expected_token[torch.arange(batch_size), last_token_index(data)] = rewards
    assert torch.equal(token, expected_token)  # reward on the last valid token, zeros elsewhere
    return out


def test_math_worker_with_think_sections(tokenizer_path):
    responses = [
        "<think>try 1/2</think> The answer is \\boxed{0.5}",
        "\\boxed{\\frac{1}{2}}",
        "<think>I think \\boxed{1/2}",  # never closes its thinking: format failure
        "<think>hmm</think> \\boxed{3}",
        "no box at all 1/2",
    ]
    data = build_batch(responses, ["\\frac{1}{2}"] * 5)
    out = _run(MathRuleRewardWorker(MathRuleRewardConfig(tokenizer_path=tokenizer_path)), data)
    assert out.batch["response_level_rewards"].tolist() == [1.0, 1.0, 0.0, 0.0, 0.0]
    metrics = out.meta_info["metrics"]
    assert metrics["reward/math/format_error"] == [0.0, 0.0, 1.0, 0.0, 0.0]
    assert metrics["reward/math/correct"] == [1.0, 1.0, 0.0, 0.0, 0.0]


def test_math_worker_reads_a_plain_ground_truth_column(tokenizer_path):
    data = build_batch(["\\boxed{4}", "\\boxed{5}"], ["4", "4"], gt_key="ground_truth")
    out = _run(MathRuleRewardWorker(MathRuleRewardConfig(tokenizer_path=tokenizer_path)), data)
    assert out.batch["scores"].tolist() == [1.0, 0.0]


def test_missing_ground_truth_is_a_clear_error(tokenizer_path):
    data = build_batch(["\\boxed{4}"], ["4"], gt_key="labels")
    with pytest.raises(RewardError, match="no ground truth"):
        MathRuleRewardWorker(MathRuleRewardConfig(tokenizer_path=tokenizer_path)).compute_rewards(data)


def test_general_val_exact_and_contains(tokenizer_path):
    responses = ["<answer>The Eiffel Tower!</answer>", "It is the eiffel tower in Paris.", "\\boxed{Louvre}", "<think>x"]
    truths = ["eiffel tower", ["Eiffel Tower", "tour eiffel"], "eiffel tower", "x"]
    exact = _run(GeneralValRuleRewardWorker(GeneralValRuleRewardConfig(tokenizer_path=tokenizer_path)), build_batch(responses, truths))
    assert exact.batch["response_level_rewards"].tolist() == [1.0, 0.0, 0.0, 0.0]
    contains = _run(GeneralValRuleRewardWorker(GeneralValRuleRewardConfig(tokenizer_path=tokenizer_path, match_mode="contains")),
                    build_batch(responses, truths))
    assert contains.batch["response_level_rewards"].tolist() == [1.0, 1.0, 0.0, 0.0]
    with pytest.raises(ConfigError, match="match_mode"):
        GeneralValRuleRewardWorker(GeneralValRuleRewardConfig(tokenizer_path=tokenizer_path, match_mode="fuzzy"))


CROSS_RESPONSES = [
    "<think>B or C</think>\nAnswer: (B)",              # strict, soft, loose
    "A careful look shows the choice is (B).",        # soft (last letter B), loose
    "I pick B. On reflection, the final is C",         # loose only (B mentioned), soft sees C last
    "The capital is Paris, definitely.",               # loose only through the option text
    "<think>B B B",                                    # unclosed think: nothing
]


@pytest.mark.parametrize("reward_type, expected", [
    ("strict", [1.0, 0.0, 0.0, 0.0, 0.0]),
    ("soft", [1.0, 1.0, 0.0, 0.0, 0.0]),
    ("loose", [1.0, 1.0, 1.0, 1.0, 0.0]),
])
def test_crossthinkqa_reward_types(tokenizer_path, reward_type, expected):
    data = build_batch(CROSS_RESPONSES, ["B"] * 4 + ["B"], extra_info=[{}, {}, {}, {"answer_text": "Paris"}, {}])
    worker = CrossThinkQARuleRewardWorker(CrossThinkQARuleRewardConfig(tokenizer_path=tokenizer_path, reward_type=reward_type))
    out = _run(worker, data)
    assert out.batch["response_level_rewards"].tolist() == expected
    assert out.meta_info["metrics"]["reward/crossthinkqa/strict"] == [1.0, 0.0, 0.0, 0.0, 0.0]


def test_crossthinkqa_strict_formats():
    judge = CrossThinkQARuleRewardWorker.judge
    assert judge("text\nThe answer is C.", "C")["strict"]
    assert judge("\\boxed{(C)}", "(C) Rome")["strict"]
    assert not judge("Answer: C because", "C")["strict"]
    with pytest.raises(RewardError, match="not an option letter"):
        judge("Answer: C", "Rome")


def test_multiple_choice_boxed_training_reward_is_the_real_reward(tokenizer_path):
    responses = ["\\boxed{B}", "so \\boxed{(c)}", "\\boxed{\\text{A}}", "The answer is B", "<think>\\boxed{B}"]
    truths = ["B", "C", "B", "B", "B"]
    worker = MultipleChoiceBoxedRuleRewardWorker(MultipleChoiceBoxedRuleRewardConfig(tokenizer_path=tokenizer_path))
    for validate in (False, True):
        data = build_batch(responses, truths)
        data.meta_info["validate"] = validate
        out = _run(worker, data)
        correctness = [1.0, 1.0, 0.0, 0.0, 0.0]
        assert out.batch["response_level_rewards"].tolist() == correctness  # training (validate=False) too
        assert out.meta_info["metrics"]["reward/mc_boxed/format_error"] == [0.0, 0.0, 0.0, 1.0, 1.0]
    penalised = MultipleChoiceBoxedRuleRewardWorker(
        MultipleChoiceBoxedRuleRewardConfig(tokenizer_path=tokenizer_path, format_error_reward=-0.5))
    assert _run(penalised, build_batch(responses, truths)).batch["response_level_rewards"].tolist() == [1.0, 1.0, 0.0, -0.5, -0.5]


IFEVAL_TRUTH = {"instruction_id_list": ["punctuation:no_comma", "change_case:english_lowercase"], "kwargs": [{}, {}]}


def test_ifeval_worker_modes_and_metrics(tokenizer_path):
    responses = ["all lower case and no commas here", "Upper Case here", "Sure:\nall lower, but a comma"]
    extra = [{}, {}, {"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]}]  # extra_info wins
    fraction = GeneralRuleRewardWorker(GeneralRuleRewardConfig(tokenizer_path=tokenizer_path))
    out = _run(fraction, build_batch(responses, [IFEVAL_TRUTH] * 3, extra_info=extra))
    assert out.batch["response_level_rewards"].tolist() == [1.0, 0.5, 0.0]
    metrics = out.meta_info["metrics"]
    assert metrics["reward/ifeval/prompt_strict"] == [1.0, 0.0, 0.0]
    assert metrics["reward/ifeval/instruction_strict"] == [1.0, 0.5, 0.0]
    all_pass = GeneralRuleRewardWorker(GeneralRuleRewardConfig(tokenizer_path=tokenizer_path, reward_mode="all"))
    assert _run(all_pass, build_batch(responses, [IFEVAL_TRUTH] * 3, extra_info=extra)).batch["scores"].tolist() == [1.0, 0.0, 0.0]


def test_detection_worker(tokenizer_path):
    truth = [{"bbox": [0, 0, 100, 100], "label": "cat"}]
    responses = ['<answer>[{"bbox_2d": [0, 0, 100, 100], "label": "cat"}]</answer>',
                 '[{"bbox_2d": [0, 0, 100, 72], "label": "cat"}]', "a cat somewhere"]
    worker = DetectionRewardWorker(DetectionRewardConfig(tokenizer_path=tokenizer_path))
    out = _run(worker, build_batch(responses, [truth] * 3))
    assert out.batch["response_level_rewards"].tolist() == pytest.approx([1.0, 0.2 + 0.8 * 0.5, 0.0])
    assert out.batch["scores"].tolist() == pytest.approx([1.0, 0.5, 0.0])
    assert out.meta_info["metrics"]["reward/detection/format"] == [1.0, 1.0, 0.0]
    # batch mAP over the 3 images (3 cats, 2 detections, 101-point COCO AP): at IoU <= 0.70 both hit,
    # recall 2/3 -> AP 67/101; at IoU >= 0.75 only the first hits, recall 1/3 -> AP 34/101; mean 0.5
    assert out.meta_info["metrics"]["reward/detection/batch_map"] == pytest.approx([0.5] * 3)


def test_empty_batch(tokenizer_path):
    data = build_batch(["\\boxed{1}"], ["1"]).select_idxs([])
    out = MathRuleRewardWorker(MathRuleRewardConfig(tokenizer_path=tokenizer_path)).compute_rewards(data)
    assert out.batch["token_level_rewards"].shape[0] == 0

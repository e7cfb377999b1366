"""The discriminative reward-model worker: its scores against a direct transformers forward of the
same model on the input written out by hand, with verl 0.9's keys and the legacy ones, micro-batched
by count and by token budget; and the errors for a model or an input it cannot score."""

from __future__ import annotations

import pytest
import torch
from model_worker_utils import local_group
from rm_batches import QUESTIONS, chat_rollout_batch, rm_expected_text
from safetensors.torch import load_file, save_file
from transformers import AutoModelForSequenceClassification

from rlvr.reward.reward_model import rm_chat_text
from rlvr.trainer.config import load_config
from rlvr.utils.errors import ConfigError, WorkerError
from rlvr.utils.testing import save_tiny_reward_model, tiny_tokenizer
from rlvr.workers.models import check_sequence_classifier
from rlvr.workers.reward_model import RewardModelWorker


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory) -> str:
    return str(save_tiny_reward_model(tmp_path_factory.mktemp("rm") / "rm", seed=3))


def rm_config(policy_dir: str, *overrides: str):
    return load_config(None, [f"actor_rollout_ref.model.path={policy_dir}", "trainer.backend=local",
                              "trainer.num_threads=1", *overrides])


@torch.no_grad()
def direct_scores(rm_dir: str) -> list[float]:
    """Each sample's score from a plain transformers forward of the hand-written input."""
    model = AutoModelForSequenceClassification.from_pretrained(rm_dir).eval()
    tokenizer = tiny_tokenizer()
    return [float(model(input_ids=torch.tensor([tokenizer(rm_expected_text(i))["input_ids"]])).logits[0, 0])
            for i in range(len(QUESTIONS))]


def check_scores(rm_scores: torch.Tensor, batch, expected: list[float]) -> None:
    last = batch.batch["response_mask"].sum(-1) - 1
    picked = rm_scores[torch.arange(len(expected)), last]
    assert torch.allclose(picked, torch.tensor(expected), atol=1e-4), (picked, expected)
    assert float(rm_scores.abs().sum() - picked.abs().sum()) == 0.0  # nothing elsewhere


def test_input_is_built_as_verl_builds_it(rm_dir):
    tokenizer, rm_tokenizer = tiny_tokenizer(), AutoTokenizerFrom(rm_dir)
    batch = chat_rollout_batch()
    for row in range(len(QUESTIONS)):
        assert rm_chat_text(batch, row, tokenizer, rm_tokenizer) == rm_expected_text(row)


def AutoTokenizerFrom(path: str):  # noqa: N802 - reads like the transformers call it stands for
    from rlvr.utils.model import load_tokenizer

    return load_tokenizer(path)


@pytest.mark.parametrize("keys", [
    ("reward.reward_model.enable=true", "reward.reward_model.model_path={rm}",
     "reward.reward_model.micro_batch_size_per_gpu=3"),
    ("reward_model.enable=true", "reward_model.model.path={rm}", "reward_model.micro_batch_size_per_gpu=2",
     "reward_model.max_length=64"),
    ("reward.reward_model.enable=true", "reward.reward_model.model_path={rm}", "reward.reward_model.use_dynamic_bsz=true",
     "reward.reward_model.forward_max_token_len_per_gpu=80"),
], ids=["verl-0.9-keys", "legacy-keys", "token-budget"])
def test_scores_equal_a_direct_transformers_forward(model_dir, rm_dir, keys):
    config = rm_config(model_dir, *(key.format(rm=rm_dir) for key in keys))
    group = local_group(RewardModelWorker, config)
    batch = chat_rollout_batch()
    output = group.compute_rm_score(batch)
    check_scores(output.batch["rm_scores"], batch, direct_scores(rm_dir))
    lengths = output.meta_info["metrics"]["reward_model/input_length"]
    assert lengths == [float(len(tiny_tokenizer()(rm_expected_text(i))["input_ids"])) for i in range(len(QUESTIONS))]


def test_a_causal_lm_or_two_labels_or_no_score_head_is_refused_before_any_worker_starts(model_dir, tmp_path):
    two = save_tiny_reward_model(tmp_path / "two", num_labels=2)
    headless = save_tiny_reward_model(tmp_path / "headless")
    weights = load_file(headless / "model.safetensors")
    del weights["score.weight"]
    save_file(weights, headless / "model.safetensors", metadata={"format": "pt"})
    cases = [(model_dir, r"LlamaForCausalLM checkpoint, not a sequence-classification model"),
             (two, "num_labels=2; rlvr reads one scalar reward"),
             (headless, r"no trained score head \(its weights lack score.weight")]
    for path, message in cases:
        with pytest.raises(ConfigError, match=rf"reward.reward_model.model_path.*{message}"):
            check_sequence_classifier(str(path))
        with pytest.raises(WorkerError, match=message):  # the worker checks again (a trainer built by hand)
            local_group(RewardModelWorker, rm_config(model_dir, "reward.reward_model.enable=true",
                                                     f"reward.reward_model.model_path={path}"))


def test_an_input_longer_than_the_limit_is_refused_naming_the_sample(model_dir, rm_dir):
    limit = len(tiny_tokenizer()(rm_expected_text(1))["input_ids"]) - 1  # sample 1 is one token too long
    config = rm_config(model_dir, "reward_model.enable=true", f"reward_model.model.path={rm_dir}",
                       f"reward_model.max_length={limit}")
    group = local_group(RewardModelWorker, config)
    with pytest.raises(WorkerError, match=rf"sample 1 \(uid '1'\): its reward-model input has {limit + 1} tokens, "
                                          rf"more than the limit {limit} \(reward.reward_model.rollout.max_model_len"):
        group.compute_rm_score(chat_rollout_batch())


def test_a_reward_model_tokenizer_without_chat_template_is_refused(model_dir, tmp_path):
    plain = save_tiny_reward_model(tmp_path / "plain", chat_template=None)
    group = local_group(RewardModelWorker, rm_config(model_dir, "reward.reward_model.enable=true",
                                                     f"reward.reward_model.model_path={plain}"))
    with pytest.raises(WorkerError, match="reward model's tokenizer has no chat template"):
        group.compute_rm_score(chat_rollout_batch())


@pytest.mark.slow
@pytest.mark.ray
def test_two_fsdp_ranks_score_as_the_direct_forward(model_dir, rm_dir, ray_groups):
    config = rm_config(model_dir, "trainer.backend=ray", "trainer.n_gpus_per_node=2",
                       "reward.reward_model.enable=true", f"reward.reward_model.model_path={rm_dir}",
                       "reward.reward_model.micro_batch_size_per_gpu=1")
    group = ray_groups(RewardModelWorker, config)
    batch = chat_rollout_batch()
    check_scores(group.compute_rm_score(batch).batch["rm_scores"], batch, direct_scores(rm_dir))

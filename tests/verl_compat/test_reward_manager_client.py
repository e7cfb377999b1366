"""verl 0.9 client code for the reward managers, with only the import renamed: a stub tokenizer
that has only ``decode``, ``compute_score_timeout`` with a function defined inside a test (which
cannot be pickled), DAPO's overlong-buffer checks with verl's messages and its penalty numbers,
and ``load_reward_manager`` on a config that holds only verl's keys. Expected values are worked out
by hand from verl's documented behaviour."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from rlvr import DataProto
from rlvr.trainer.ppo.reward import compute_reward, load_reward_manager
from rlvr.workers.reward_manager import DAPORewardManager, NaiveRewardManager


class DecodeOnlyTokenizer:
    """The stub verl's reward-manager tests use: ``decode`` only (ids joined by spaces)."""

    eos_token = "</s>"

    def decode(self, token_ids, skip_special_tokens=True):
        return " ".join(str(int(token_id)) for token_id in token_ids)


def batch(response_lengths=(4, 4), seq_len=4) -> DataProto:
    """Prompts of ``seq_len`` ones; responses ``1, 2, ...`` with the given valid lengths."""
    rows = len(response_lengths)
    responses = torch.arange(1, seq_len + 1).repeat(rows, 1)
    response_mask = torch.tensor([[1] * n + [0] * (seq_len - n) for n in response_lengths])
    return DataProto.from_dict(
        tensors={"prompts": torch.ones(rows, seq_len, dtype=torch.long), "responses": responses,
                 "attention_mask": torch.cat([torch.ones(rows, seq_len, dtype=torch.long), response_mask], dim=1)},
        non_tensors={"reward_model": np.array([{"ground_truth": "1"}] * rows, dtype=object),
                     "data_source": np.array(["unit_test"] * rows, dtype=object)},
    )


def constant_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return 0.5


def test_a_tokenizer_with_only_decode_is_decoded_row_by_row():
    seen = []

    def record(data_source, solution_str, ground_truth, extra_info=None):
        seen.append(solution_str)
        return float(len(solution_str.split()))

    rewards = NaiveRewardManager(DecodeOnlyTokenizer(), 0, record)(batch(response_lengths=(4, 2)))
    assert seen == ["1 2 3 4", "1 2"]  # each response up to its last valid token
    assert rewards.tolist() == [[0, 0, 0, 4.0], [0, 2.0, 0, 0]]  # on the last valid token


def test_compute_score_timeout_with_a_local_function():
    """A function defined here cannot be pickled, so it cannot go to a helper process: it is scored
    in this process under a SIGALRM limit, as verl does; a sample over the limit is a timeout."""

    def slow_on_short(data_source, solution_str, ground_truth, extra_info=None):
        if len(solution_str.split()) < 3:
            time.sleep(5)
        return 1.0

    manager = NaiveRewardManager(DecodeOnlyTokenizer(), 0, slow_on_short, compute_score_timeout=0.3,
                                 on_error="fallback", fallback_score=-1.0)
    assert manager.pool is None  # nothing to send to a helper process
    start = time.monotonic()
    result = manager(batch(response_lengths=(4, 2)), return_dict=True)
    assert time.monotonic() - start < 3.0  # the 5 s sleep was cut at the limit
    assert result["reward_tensor"][0, 3].item() == 1.0 and result["reward_tensor"][1, 1].item() == -1.0
    assert result["reward_metrics"]["reward/unit_test/timeouts"] == 1.0
    strict = NaiveRewardManager(DecodeOnlyTokenizer(), 0, slow_on_short, compute_score_timeout=0.3, on_error="raise")
    with pytest.raises(Exception, match="compute_score ran past compute_score_timeout=0.3 s"):
        strict(batch(response_lengths=(2,)))


def test_a_module_level_function_still_goes_to_a_killable_helper_process():
    manager = NaiveRewardManager(DecodeOnlyTokenizer(), 0, constant_score, compute_score_timeout=120.0)
    try:
        assert manager.pool is not None and manager.in_process_limit is None
        assert manager(batch()).tolist() == [[0, 0, 0, 0.5], [0, 0, 0, 0.5]]
    finally:
        manager.close()


def _overlong(enable: bool, length: int = 128):
    return OmegaConf.create({"enable": enable, "len": length, "penalty_factor": 1.0, "log": False})


def test_dapo_overlong_buffer_checks_have_verls_messages():
    manager = DAPORewardManager(DecodeOnlyTokenizer(), 0, constant_score, max_resp_len=None,
                                overlong_buffer_cfg=_overlong(False))
    assert manager.max_resp_len is None  # a disabled buffer needs no max_resp_len
    with pytest.raises(AssertionError, match="max_resp_len must be provided"):
        DAPORewardManager(DecodeOnlyTokenizer(), 0, constant_score, max_resp_len=None,
                          overlong_buffer_cfg=_overlong(True))
    with pytest.raises(AssertionError, match="max_resp_len must be larger"):
        DAPORewardManager(DecodeOnlyTokenizer(), 0, constant_score, max_resp_len=64,
                          overlong_buffer_cfg=_overlong(True, length=128))


def test_dapo_penalty_numbers():
    """max_resp_len 4, buffer 2: a 4-token response exceeds 4 - 2 = 2 by 2, penalty -2 / 2 * 1 = -1;
    a 2-token one is not penalised. Without a buffer config the score alone."""
    manager = DAPORewardManager(DecodeOnlyTokenizer(), 0, constant_score, max_resp_len=4,
                                overlong_buffer_cfg=_overlong(True, length=2))
    rewards = manager(batch(response_lengths=(4, 3, 2)))
    assert rewards[0, 3].item() == pytest.approx(0.5 - 1.0)
    assert rewards[1, 2].item() == pytest.approx(0.5 - 0.5)  # exceeds by 1: -1 / 2
    assert rewards[2, 1].item() == pytest.approx(0.5)
    plain = DAPORewardManager(DecodeOnlyTokenizer(), 0, constant_score)
    assert torch.all(plain(batch())[:, -1] == 0.5)


def test_load_reward_manager_on_a_config_with_only_verls_keys(tmp_path):
    """verl's ``load_reward_manager(config, tokenizer, num_examine)`` with verl's sections: rlvr's
    own keys (``on_error``, ``fallback_score``, ``num_workers``, ...) take the schema's defaults."""
    scorer = tmp_path / "my_reward.py"
    scorer.write_text("def score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):\n"
                      "    return len(solution_str.split()) + bonus\n")
    config = OmegaConf.create({
        "data": {"max_response_length": 4},
        "reward_model": {"reward_manager": "dapo", "reward_kwargs": {},
                         "overlong_buffer": {"enable": True, "len": 2, "penalty_factor": 1.0, "log": False}},
        "custom_reward_function": {"path": str(scorer), "name": "score", "reward_kwargs": {"bonus": 0.25}},
    })
    OmegaConf.set_struct(config, True)
    manager = load_reward_manager(config, DecodeOnlyTokenizer(), num_examine=0)
    assert isinstance(manager, DAPORewardManager)
    assert manager.on_error == "fallback_timeouts"  # the naive manager's default (DAPO extends it), as verl
    data = batch(response_lengths=(4, 2))
    scores, _ = compute_reward(data, manager)
    assert scores[0, 3].item() == pytest.approx(4.25 - 1.0) and scores[1, 1].item() == pytest.approx(2.25)
    naive = OmegaConf.create({"reward_model": {"reward_manager": "naive"},
                              "custom_reward_function": {"path": None}})
    assert isinstance(load_reward_manager(naive, DecodeOnlyTokenizer(), 0), NaiveRewardManager)

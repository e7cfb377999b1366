"""The reward managers driven as verl's own tests drive them: a stub tokenizer that has only
``decode``/``batch_decode``, a batch without ``response_mask`` (the response part of
``attention_mask`` counts), ``reward_model`` dicts without a ground truth, and
``compute_score_timeout``."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from rlvr.protocol import DataProto
from rlvr.reward.scorers import UnknownDataSourceError, default_compute_score
from rlvr.reward.scorers.custom import CustomRewardFunction
from rlvr.utils.errors import RewardError
from rlvr.workers.reward_manager import BatchRewardManager, DAPORewardManager, NaiveRewardManager


class StubTokenizer:
    """Only what verl's tests give a reward manager: token ``i`` decodes to one letter."""

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(chr(ord("a") + int(i) % 26) for i in ids)

    def batch_decode(self, sequences, skip_special_tokens: bool = False) -> list[str]:
        return [self.decode(ids, skip_special_tokens) for ids in sequences]


def _length_score(data_source, solution_str, ground_truth, extra_info=None):
    return len(solution_str)


def _batch() -> DataProto:
    """Two samples, prompts of 3 and responses of 3 columns: 2 and 1 valid response tokens."""
    return DataProto.from_single_dict({
        "prompts": torch.tensor([[1, 2, 3], [7, 8, 9]]),
        "responses": torch.tensor([[4, 5, 6], [7, 8, 9]]),
        "attention_mask": torch.tensor([[0, 1, 1, 1, 1, 0], [0, 1, 1, 1, 0, 0]]),
        "reward_model": np.array([{}, {}], dtype=object),
        "data_source": np.array(["source1", "source2"], dtype=object),
    })


def test_naive_manager_with_a_stub_tokenizer_and_verls_batch():
    reward = NaiveRewardManager(StubTokenizer(), 0, _length_score)(_batch())
    assert reward.tolist() == [[0.0, 2.0, 0.0], [1.0, 0.0, 0.0]]
    out = NaiveRewardManager(StubTokenizer(), 0, _length_score)(_batch(), return_dict=True)
    assert out["reward_metrics"]["reward/source1/mean_score"] == 2.0


def test_async_scorers_are_awaited():
    async def async_length(data_source, solution_str, ground_truth, extra_info=None):
        await asyncio.sleep(0.2)
        return len(solution_str)

    start = time.monotonic()
    for manager_cls in (NaiveRewardManager, DAPORewardManager):
        assert manager_cls(StubTokenizer(), 0, async_length)(_batch()).tolist() == [[0.0, 2.0, 0.0], [1.0, 0.0, 0.0]]
    assert time.monotonic() - start < 2.0  # the samples of one batch are awaited together


def test_dapo_manager_with_an_overlong_buffer_config():
    overlong = OmegaConf.create({"enable": True, "len": 10, "penalty_factor": 1.0, "log": False})
    manager = DAPORewardManager(StubTokenizer(), 0, _length_score, max_resp_len=20, overlong_buffer_cfg=overlong)
    assert manager(_batch()).tolist() == [[0.0, 2.0, 0.0], [1.0, 0.0, 0.0]]  # far below the buffer: no penalty
    short = DAPORewardManager(StubTokenizer(), 0, _length_score, max_resp_len=2,
                              overlong_buffer_cfg={"enable": True, "len": 2, "penalty_factor": 1.0})
    # L_max 2, buffer 2: penalty -(L - 0) / 2 -> 2 tokens -1.0, 1 token -0.5
    assert short(_batch()).tolist() == [[0.0, 1.0, 0.0], [0.5, 0.0, 0.0]]
    with pytest.raises(AssertionError, match="max_resp_len must be provided"):  # verl asserts these arguments
        DAPORewardManager(StubTokenizer(), 0, _length_score, overlong_buffer_cfg=overlong)
    with pytest.raises(AssertionError, match=r"overlong_buffer.len.*max_resp_len must be larger than "
                                             r"overlong_buffer.len: the buffer of 10 tokens"):
        DAPORewardManager(StubTokenizer(), 0, _length_score, max_resp_len=5, overlong_buffer_cfg=overlong)
    with pytest.raises(AssertionError, match=r"overlong_buffer.len.*must be > 0 tokens long, got 0"):
        DAPORewardManager(StubTokenizer(), 0, _length_score, max_resp_len=5,
                          overlong_buffer_cfg={"enable": True, "len": 0})


def test_batch_manager_gets_lists():
    def batch_score(data_sources, solution_strs, ground_truths, extra_infos):
        return [len(s) for s in solution_strs]

    assert BatchRewardManager(StubTokenizer(), 0, batch_score)(_batch()).tolist() == [[0.0, 2.0, 0.0], [1.0, 0.0, 0.0]]


SLOW_SCORER = '''
import time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if data_source == "slow":
        time.sleep(60)
    return float(len(solution_str))
'''


def test_compute_score_timeout_bounds_every_sample(tmp_path):
    path = tmp_path / "slow_scorer.py"
    path.write_text(SLOW_SCORER)
    scorer = CustomRewardFunction(str(path), "compute_score")
    data = _batch()
    data.non_tensor_batch["data_source"] = np.array(["fast", "slow"], dtype=object)
    with NaiveRewardManager(StubTokenizer(), 0, scorer, "data_source", 2.0, on_error="fallback") as manager:
        out = manager(data, return_dict=True)
    assert out["reward_tensor"].tolist() == [[0.0, 2.0, 0.0], [0.0, 0.0, 0.0]]  # the slow sample scores 0
    assert out["reward_metrics"]["reward/slow/timeouts"] == 1.0
    with NaiveRewardManager(StubTokenizer(), 0, scorer, compute_score_timeout=2.0, on_error="raise") as manager:
        with pytest.raises(RewardError, match=r"sample 1 \(data_source 'slow'\) timed out"):
            manager(data)
    local = NaiveRewardManager(StubTokenizer(), 0, lambda **_: 1.0, compute_score_timeout=1.0)
    assert local.pool is None and local(data).tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]  # limited in-process
    with pytest.raises(ValueError, match="must be > 0 seconds"):
        NaiveRewardManager(StubTokenizer(), 0, scorer, compute_score_timeout=0)


def test_error_types_are_verls():
    with pytest.raises(NotImplementedError):  # verl's default_compute_score raises NotImplementedError
        default_compute_score("no_such_source", "x", "y")
    assert issubclass(UnknownDataSourceError, RewardError)

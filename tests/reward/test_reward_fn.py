"""compute_reward / load_reward_manager / get_custom_reward_fn (verl's trainer API)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from omegaconf import OmegaConf

from rlvr.protocol import DataProto
from rlvr.trainer.config.schema import RlvrConfig
from rlvr.reward.reward_fn import compute_reward, get_custom_reward_fn, load_reward_manager
from rlvr.utils.errors import ConfigError, RewardError
from rlvr.utils.testing import tiny_tokenizer
from rlvr.reward.managers import (
    BatchRewardManager,
    DAPORewardManager,
    NaiveRewardManager,
    ParallelRewardManager,
)

CUSTOM = '''
def my_score(data_source, solution_str, ground_truth, extra_info=None, scale=1.0):
    return scale * float(solution_str.strip() == ground_truth)

def helper():
    return 0
'''


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def _batch(tok, responses, data_sources, ground_truths, response_len=8) -> DataProto:
    """Prompts of one token, responses right-padded with EOS appended."""
    ids = [tok.encode(r, add_special_tokens=False)[: response_len - 1] + [tok.eos_token_id] for r in responses]
    responses_t = torch.full((len(ids), response_len), tok.pad_token_id)
    mask = torch.zeros(len(ids), response_len, dtype=torch.long)
    for i, row in enumerate(ids):
        responses_t[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    prompts = torch.full((len(ids), 1), tok.encode("q")[0])
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses_t,
            "attention_mask": torch.cat([torch.ones_like(prompts), mask], dim=1),
            "response_mask": mask,
        },
        non_tensors={"data_source": list(data_sources), "reward_model": [{"ground_truth": g} for g in ground_truths]},
    )


@pytest.fixture(params=["dataclass", "omegaconf"])
def make_config(request):
    def make(**reward_model):
        config = RlvrConfig()
        config.reward_model = dataclasses.replace(config.reward_model, **reward_model)
        return config if request.param == "dataclass" else OmegaConf.structured(config)

    return make


def test_load_each_manager_from_the_config(make_config, tok):
    assert isinstance(load_reward_manager(make_config(), tok, 1), NaiveRewardManager)
    assert isinstance(load_reward_manager(make_config(reward_manager="batch"), tok, 1), BatchRewardManager)
    config = make_config(reward_manager="dapo", on_error="fallback", fallback_score=-2.0)
    config.reward_model.overlong_buffer.enable = True
    config.reward_model.overlong_buffer.len = 16
    dapo = load_reward_manager(config, tok, 0)
    assert isinstance(dapo, DAPORewardManager)
    assert (dapo.max_resp_len, dapo.overlong.len, dapo.on_error, dapo.fallback_score) == (128, 16, "fallback", -2.0)
    parallel = load_reward_manager(make_config(reward_manager="parallel", num_workers=3, timeout_s=2.5), tok, 0)
    assert isinstance(parallel, ParallelRewardManager)
    assert (parallel.pool.num_workers, parallel.pool.timeout_s) == (3, 2.5)
    parallel.close()


def test_unknown_manager_is_a_config_error(make_config, tok):
    with pytest.raises(ConfigError, match=r"reward_model.reward_manager.*Unknown reward manager: prime.*batch, dapo, naive, parallel"):
        load_reward_manager(make_config(reward_manager="prime"), tok, 0)


def test_custom_reward_function_from_file(make_config, tok, tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(CUSTOM)
    config = make_config(reward_kwargs={"fallback_score": -3.0})
    config.custom_reward_function.path = str(path)
    config.custom_reward_function.name = "my_score"
    fn = get_custom_reward_fn(config)
    assert fn("any", " yes ", "yes") == 1.0
    config.custom_reward_function.reward_kwargs = {"scale": 2.0}
    assert get_custom_reward_fn(config)("any", "yes", "yes") == 2.0
    config.custom_reward_function.reward_kwargs = {}
    manager = load_reward_manager(config, tok, 0)
    assert manager.fallback_score == -3.0  # reward_model.reward_kwargs reach the manager
    assert load_reward_manager(config, tok, 0, fallback_score=-4.0).fallback_score == -4.0
    data = _batch(tok, ["yes", "no"], ["anything", "anything"], ["yes", "yes"])
    reward, extra = compute_reward(data, manager)
    assert reward.sum(dim=-1).tolist() == [1.0, 0.0]
    assert extra == {}
    assert data.meta_info["metrics"]["reward/anything/mean_score"] == 0.5


def test_custom_reward_function_errors(make_config, tmp_path):
    config = make_config()
    assert get_custom_reward_fn(config) is None
    config.custom_reward_function.path = str(tmp_path / "missing.py")
    with pytest.raises(ConfigError, match="custom_reward_function.path.*does not exist"):
        get_custom_reward_fn(config)
    path = tmp_path / "has_other.py"
    path.write_text(CUSTOM)
    config.custom_reward_function.path = str(path)
    config.custom_reward_function.name = "compute_score"
    with pytest.raises(ConfigError, match="no function 'compute_score'; functions defined there: helper, my_score"):
        get_custom_reward_fn(config)
    broken = tmp_path / "broken.py"
    broken.write_text("import not_a_module_anywhere\n")
    config.custom_reward_function.path = str(broken)
    with pytest.raises(ConfigError, match="ModuleNotFoundError"):
        get_custom_reward_fn(config)


def test_compute_reward_returns_scores_extra_info_and_metrics(tok):
    data = _batch(tok, ["#### 4", "#### 5", "#### 4"], ["openai/gsm8k"] * 3, ["4", "4", "4"])
    reward, extra = compute_reward(data, NaiveRewardManager(tok, 0))
    assert reward.shape == (3, 8) and reward.dtype == torch.float32
    assert reward[:, 6].tolist() == [1.0, 0.0, 1.0]  # 6 chars + EOS -> last valid index 6
    assert extra == {}  # the GSM8K scorer returns a plain float, as verl's does
    assert data.meta_info["metrics"]["reward/openai/gsm8k/mean_score"] == pytest.approx(2 / 3)


def test_compute_reward_checks_the_contract(tok):
    data = _batch(tok, ["a"], ["s"], ["a"])

    def wrong_shape(data, return_dict=False):
        return {"reward_tensor": torch.zeros(1, 3)}

    def short_info(data, return_dict=False):
        return {"reward_tensor": torch.zeros(1, 8), "reward_extra_info": {"acc": []}}

    with pytest.raises(RewardError, match=r"wrong_shape.? produced token_level_scores of shape \[1, 3\]"):
        compute_reward(data, wrong_shape)
    with pytest.raises(RewardError, match="reward_extra_info\\['acc'\\] with 0 entries"):
        compute_reward(data, short_info)
    with pytest.raises(RewardError, match="must return a dict"):
        compute_reward(data, lambda data, return_dict=False: torch.zeros(1, 8))

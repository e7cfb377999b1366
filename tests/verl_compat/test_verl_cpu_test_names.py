"""Names verl 0.9.1's CPU tests import, at verl's paths with ``verl`` -> ``rlvr``, checked with
values worked out by hand: ``ray_trainer.compute_advantage`` / ``apply_kl_penalty`` /
``compute_response_mask`` / ``compute_spec_decode_metrics``, ``v1.utils`` multi-trajectory GRPO,
``base_config.BaseConfig``, ``constants_ppo``, ``utils.ray_utils.parallel_put``."""

from __future__ import annotations

import os
from dataclasses import FrozenInstanceError, dataclass
from unittest.mock import patch

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from rlvr.base_config import BaseConfig
from rlvr.protocol import DataProto
from rlvr.trainer.constants_ppo import NVTX_INJECTION_ENV, get_ppo_ray_runtime_env
from rlvr.trainer.ppo.core_algos import FixedKLController
from rlvr.trainer.ppo.ray_trainer import (
    apply_kl_penalty,
    compute_advantage,
    compute_response_mask,
    compute_spec_decode_metrics,
)
from rlvr.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories


def _batch(scores, mask, uids) -> DataProto:
    rewards = torch.zeros(len(scores), mask.shape[1])
    rewards[torch.arange(len(scores)), mask.sum(-1) - 1] = torch.tensor(scores)  # the score on the last token
    return DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask},
                               non_tensors={"uid": np.array(uids, dtype=object)})


def test_compute_advantage_grpo_by_hand_and_its_std_switch():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    data = compute_advantage(_batch([1.0, 0.0, 2.0], mask, ["a", "a", "a"]), "grpo")
    # mean 1, unbiased std 1: (s - 1) / (1 + 1e-6) on each valid token
    expected = torch.tensor([0.0, -1.0, 1.0]) / (1 + 1e-6)
    assert torch.allclose(data.batch["advantages"], expected[:, None] * mask)
    plain = compute_advantage(_batch([1.0, 0.0, 2.0], mask, ["a", "a", "a"]), "grpo", norm_adv_by_std_in_grpo=False)
    assert torch.allclose(plain.batch["advantages"], torch.tensor([0.0, -1.0, 1.0])[:, None] * mask)


def test_compute_advantage_gae_takes_gamma_and_lam_from_the_arguments():
    mask = torch.ones(1, 2)
    data = DataProto.from_dict(tensors={"token_level_rewards": torch.tensor([[0.0, 1.0]]), "response_mask": mask,
                                        "values": torch.tensor([[0.5, 0.25]])})
    adv = compute_advantage(data, "gae", gamma=0.5, lam=0.5).batch["advantages"]
    # delta_1 = 1 - 0.25 = 0.75; delta_0 = 0 + 0.5 * 0.25 - 0.5 = -0.375; A_0 = delta_0 + 0.25 * 0.75 (then whitened)
    raw = torch.tensor([[-0.375 + 0.25 * 0.75, 0.75]])
    assert torch.allclose(adv, (raw - raw.mean()) / (raw.std() + 1e-8), atol=1e-5)


def test_response_mask_kl_penalty_and_spec_decode_by_hand():
    data = DataProto.from_dict(tensors={"responses": torch.zeros(2, 2, dtype=torch.long),
                                        "attention_mask": torch.tensor([[0, 1, 1, 1], [1, 1, 1, 0]])})
    assert compute_response_mask(data).tolist() == [[1, 1], [1, 0]]
    data.batch["response_mask"] = compute_response_mask(data)
    data.batch["token_level_scores"] = torch.tensor([[0.0, 1.0], [2.0, 0.0]])
    data.batch["old_log_probs"] = torch.tensor([[-1.0, -1.0], [-0.5, -3.0]])
    data.batch["ref_log_prob"] = torch.tensor([[-1.5, -1.0], [-1.0, -1.0]])
    data, metrics = apply_kl_penalty(data, FixedKLController(0.1), "kl")
    # kl = old - ref on valid tokens: [0.5, 0], [0.5, -]; rewards = scores - 0.1 kl
    assert torch.allclose(data.batch["token_level_rewards"], torch.tensor([[-0.05, 1.0], [1.95, 0.0]]))
    assert metrics == {"actor/reward_kl_penalty": pytest.approx((0.25 + 0.5) / 2), "actor/reward_kl_penalty_coeff": 0.1}
    spec = compute_spec_decode_metrics([4, 2, 0], [2, 2, 0], [2, 1, 0], non_padding_mask=[True, True, False])
    assert spec == {"rollout/spec_accept_rate": pytest.approx((0.5 + 1.0) / 2),
                    "rollout/spec_accept_length": pytest.approx((2.0 + 3.0) / 2)}
    assert compute_spec_decode_metrics(None, None, None) == {}
    with pytest.raises(AssertionError, match="only some"):
        compute_spec_decode_metrics([1], None, [1])


def test_multi_trajectory_grpo_judges_each_session_by_its_last_output():
    mask = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1]])
    # sessions of prompt p: s0 = rows 0 (index 0) and 1 (index 1, its last); s1 = rows 2, 3 (last: row 2, index 5)
    data = _batch([9.0, 1.0, 3.0, 7.0], mask, ["p"] * 4)
    out = compute_advantage_for_multi_trajectories(data, ["p_s0_0", "p_s0_1", "p_s1_5", "p_s1_2"], "grpo")
    # last outputs score 1 and 3: mean 2, unbiased std sqrt(2) -> -1/sqrt(2), 1/sqrt(2)
    a = 1 / (2 ** 0.5 + 1e-6)
    expected = torch.tensor([[-a, -a], [-a, 0.0], [a, a], [a, a]])
    assert torch.allclose(out.batch["advantages"], expected) and torch.equal(out.batch["returns"], out.batch["advantages"])
    with pytest.raises(AssertionError, match="not <uid>_<session_id>_<index>"):
        compute_advantage_for_multi_trajectories(_batch([1.0], mask[:1], ["p"]), ["bad"], "grpo")


@dataclass
class _Config(BaseConfig):
    _mutable_fields = {"lr"}
    lr: float = 0.1
    name: str = "actor"


def test_base_config_reads_like_a_mapping_and_freezes_its_fields():
    cfg = _Config()
    assert cfg["lr"] == 0.1 and cfg.get("missing", 3) == 3 and list(cfg) == ["_target_", "lr", "name"] and len(cfg) == 3
    cfg.lr = 0.2
    with pytest.raises(FrozenInstanceError, match="'name' is frozen"):
        cfg.name = "critic"
    with pytest.raises(AttributeError):
        cfg["missing"]


def test_ray_runtime_env_frees_cupti_for_the_torch_profiler():
    torch_cfg = OmegaConf.create({"global_profiler": {"tool": "torch"}})
    with patch.dict(os.environ, {NVTX_INJECTION_ENV: "/lib/libcupti.so", "NCCL_DEBUG": "INFO"}, clear=True):
        env = get_ppo_ray_runtime_env(torch_cfg)["env_vars"]
        assert env[NVTX_INJECTION_ENV] not in ("", "/lib/libcupti.so") and "NCCL_DEBUG" not in env  # the shell's kept
        assert NVTX_INJECTION_ENV not in get_ppo_ray_runtime_env(None)["env_vars"]
    with patch.dict(os.environ, {"VERL_KEEP_NVTX_INJECTION": "1"}, clear=True):
        assert NVTX_INJECTION_ENV not in get_ppo_ray_runtime_env(torch_cfg)["env_vars"]


@pytest.mark.slow
@pytest.mark.ray
def test_parallel_put_keeps_the_order(verl_ray_cluster):
    import ray

    from rlvr.utils.ray_utils import parallel_put

    items = [{"i": i, "x": np.full(i + 1, i)} for i in range(20)]
    got = ray.get(parallel_put(items, max_workers=3))
    assert [g["i"] for g in got] == list(range(20)) and all((g["x"] == g["i"]).all() for g in got)
    with pytest.raises(AssertionError, match="empty"):
        parallel_put([])

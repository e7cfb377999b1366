"""``rlvr.trainer.ppo.utils``: verl's ``need_reward_model`` on verl-shaped and rlvr configs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from rlvr.trainer.config import load_config
from rlvr.trainer.ppo.utils import need_reward_model


def _reward_section_only(enable):
    """A config holding only verl's ``reward.reward_model`` section, as verl's callers build it."""
    return OmegaConf.create({"reward": {"reward_model": {"enable": enable, "enable_resource_pool": False,
                                                         "model_path": "some/rm"}}})


@pytest.mark.parametrize(("enable", "expected"), [(True, True), (False, False), (None, False)])
def test_reads_reward_model_enable(enable, expected):
    assert need_reward_model(_reward_section_only(enable)) is expected


def test_struct_mode_and_plain_objects():
    cfg = _reward_section_only(True)
    OmegaConf.set_struct(cfg, True)
    assert need_reward_model(cfg) is True
    namespace = SimpleNamespace(reward=SimpleNamespace(reward_model=SimpleNamespace(enable=False)))
    assert need_reward_model(namespace) is False


@pytest.mark.parametrize(("overrides", "expected"), [
    ([], False),
    (["reward.reward_model.enable=true", "reward.reward_model.model_path=some/rm"], True),
    (["reward_model.enable=true", "reward_model.model.path=some/rm"], True),  # verl's legacy keys
])
def test_loaded_rlvr_config(overrides, expected):
    cfg = load_config(None, ["trainer.backend=local", *overrides])
    assert need_reward_model(cfg) is expected


def test_missing_section_names_the_key():
    with pytest.raises(AttributeError, match="reward"):  # OmegaConf's ConfigAttributeError
        need_reward_model(OmegaConf.create({"trainer": {}}))

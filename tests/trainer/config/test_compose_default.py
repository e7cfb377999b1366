"""The config load without Hydra's compose (``compose_default``: ``ppo_trainer``, no config folder, plain
overrides) builds exactly what Hydra's compose builds, and hands every other override to Hydra."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from rlvr.trainer.config.compose import compose_default, compose_with_hydra
from rlvr.trainer.config.loader import _load_preset, _merge, _schema_config
from rlvr.utils.errors import ConfigError


def _base(preset: str | None) -> dict:
    schema = _schema_config()
    base = _merge([schema, *_load_preset(preset)], preset) if preset else schema
    return OmegaConf.to_container(base, resolve=False)


PLAIN = [
    [],
    ["trainer.seed=3", "data.train_batch_size=4", "actor_rollout_ref.actor.optim.lr=1e-5"],
    ['trainer.logger=["console","jsonl"]', "trainer.experiment_name='run a'", "trainer.project_name=null"],
    ["actor_rollout_ref.rollout.stop=['</answer>', 'END']", "data.max_prompt_length=${data.max_response_length}"],
    ["++actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4", "++trainer.seed=9", "trainer.seed=10"],
    ["++actor_rollout_ref.actor.some_verl_only_key=true", "algorithm.kl_ctrl={kl_coef: 0.2}"],
    ["trainer.total_epochs=2", "trainer.total_epochs=5"],  # the later value wins
]


@pytest.mark.parametrize("preset", [None, "main_job"])
@pytest.mark.parametrize("overrides", PLAIN, ids=range(len(PLAIN)))
def test_equal_to_hydras_compose(preset, overrides):
    base = _base(preset)
    fast = compose_default(base, overrides)
    assert fast is not None
    hydra = compose_with_hydra(base, "ppo_trainer", None, overrides)
    assert OmegaConf.to_container(fast, resolve=False) == OmegaConf.to_container(hydra, resolve=False)
    assert OmegaConf.is_struct(fast) == OmegaConf.is_struct(hydra) is True
    assert fast.model_engine == "dp"


@pytest.mark.parametrize("override", [
    "model_engine=megatron",  # a config group
    "+data.seed=5",  # Hydra checks that the key is new
    "~trainer.seed",
    "hydra.run.dir=x",
    "trainer.no_such_key=1",  # Hydra's own error: "Could not override"
])
def test_hands_the_rest_to_hydra(override):
    assert compose_default(_base(None), ["trainer.seed=3", override]) is None


def test_an_override_hydra_refuses_keeps_hydras_error():
    base = _base(None)
    with pytest.raises(ConfigError, match="no_such_key"):
        compose_with_hydra(base, "ppo_trainer", None, ["trainer.no_such_key=1"])
    assert compose_default(base, ["trainer.no_such_key=1"]) is None

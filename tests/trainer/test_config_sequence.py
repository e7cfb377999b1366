"""Config checks of packing, token budgets and Ulysses sequence parallelism (verl's keys): each error
names the key, before any worker starts; the log-prob passes follow the actor's token budget."""

from __future__ import annotations

import pytest

from rlvr.trainer.config import load_config, validate_config
from rlvr.utils.errors import ConfigError
from rlvr.utils.testing import save_tiny_model

from trainer_helpers import tiny_overrides

ACTOR_SP = "actor_rollout_ref.actor.ulysses_sequence_parallel_size"
RAY_4 = {"trainer.backend": "ray", "trainer.n_gpus_per_node": 4,
         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4, "critic.ppo_micro_batch_size_per_gpu": 4}
PACKED = {"actor_rollout_ref.model.use_remove_padding": True}


@pytest.fixture
def overrides(tiny_model_dir, tiny_data, tmp_path):
    def make(**extra):
        return tiny_overrides(tiny_model_dir, tiny_data, tmp_path / "run", **extra)

    return make


@pytest.fixture(scope="module")
def six_head_model(tmp_path_factory) -> str:
    return str(save_tiny_model(tmp_path_factory.mktemp("six") / "model", hidden_size=48, num_attention_heads=6,
                               num_key_value_heads=6))


def test_sequence_parallelism_with_packing_on_enough_workers_is_valid(overrides):
    validate_config(load_config("grpo", overrides(**RAY_4, **PACKED, **{ACTOR_SP: 4})))
    validate_config(load_config("ppo", overrides(**RAY_4, **{
        "critic.ulysses_sequence_parallel_size": 2, "critic.model.use_remove_padding": True,
        "critic.use_dynamic_bsz": True})))


CASES = [
    ({**RAY_4, ACTOR_SP: 2}, ACTOR_SP, "splits packed sequences; set actor_rollout_ref.model.use_remove_padding=true"),
    ({ACTOR_SP: 2, "actor_rollout_ref.model.use_remove_padding": True}, ACTOR_SP,
     "2 sequence-parallel ranks do not divide the 1 workers"),
    ({**RAY_4, ACTOR_SP: 3, "actor_rollout_ref.model.use_remove_padding": True}, ACTOR_SP,
     "3 sequence-parallel ranks do not divide the 4 workers"),
    ({"actor_rollout_ref.actor.use_dynamic_bsz": True, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 0},
     "actor_rollout_ref.actor.ppo_max_token_len_per_gpu", "the token budget must be >= 1, got 0"),
    ({"actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": -1},
     "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu", "the token budget must be >= 1"),
]


@pytest.mark.parametrize(("extra", "key", "message"), CASES, ids=[str(i) for i in range(len(CASES))])
def test_sequence_layout_errors_name_the_key(overrides, extra, key, message):
    cfg = load_config("grpo", overrides(**extra))
    with pytest.raises(ConfigError, match=message) as info:
        validate_config(cfg)
    assert info.value.key == key


def test_critic_sequence_parallelism_needs_the_critics_packing(overrides):
    cfg = load_config("ppo", overrides(**RAY_4, **{"critic.ulysses_sequence_parallel_size": 2,
                                                   "actor_rollout_ref.model.use_remove_padding": True}))
    with pytest.raises(ConfigError, match="set critic.model.use_remove_padding=true") as info:
        validate_config(cfg)
    assert info.value.key == "critic.ulysses_sequence_parallel_size"


def test_heads_that_do_not_split_over_the_group_are_a_config_error(overrides, six_head_model):
    cfg = load_config("grpo", overrides(**RAY_4, **{
        "actor_rollout_ref.model.path": six_head_model, "actor_rollout_ref.model.use_remove_padding": True,
        ACTOR_SP: 4}))
    with pytest.raises(ConfigError, match="the model has 6 attention heads, which do not split over 4") as info:
        validate_config(cfg)
    assert info.value.key == ACTOR_SP
    # the reference follows the actor's size unless set: a size of its own is checked on its own key
    cfg = load_config("grpo", overrides(**RAY_4, **{
        "actor_rollout_ref.model.path": six_head_model, "actor_rollout_ref.model.use_remove_padding": True,
        ACTOR_SP: 2, "actor_rollout_ref.actor.use_kl_loss": True,
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size": 4}))
    with pytest.raises(ConfigError, match="6 attention heads") as info:
        validate_config(cfg)
    assert info.value.key == "actor_rollout_ref.ref.ulysses_sequence_parallel_size"


def test_log_prob_passes_follow_the_actors_token_budget_unless_set(overrides):
    cfg = load_config("grpo", overrides(**{"actor_rollout_ref.actor.use_dynamic_bsz": True,
                                           "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 999}))
    arr = cfg.actor_rollout_ref
    for section in (arr.rollout, arr.ref):
        assert section.log_prob_use_dynamic_bsz is True and section.log_prob_max_token_len_per_gpu == 999
    assert arr.ref.ulysses_sequence_parallel_size == 1
    cfg = load_config("grpo", overrides(**{"actor_rollout_ref.actor.use_dynamic_bsz": True,
                                           "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": 123}))
    assert cfg.actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu == 123
    assert cfg.actor_rollout_ref.ref.log_prob_max_token_len_per_gpu == 16384
    critic = load_config("ppo", overrides(**{"critic.ppo_max_token_len_per_gpu": 77})).critic
    assert critic.forward_max_token_len_per_gpu == 77
    defaults = load_config("grpo", overrides())
    assert defaults.actor_rollout_ref.model.use_remove_padding is False
    assert defaults.actor_rollout_ref.rollout.log_prob_use_dynamic_bsz is False

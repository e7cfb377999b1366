"""Which backend and layout each role gets, and the config errors of strategy=megatron (no
megatron-core needed: the check must work where it is not installed)."""

from __future__ import annotations

import copy

import pytest
from omegaconf import OmegaConf

from rlvr.trainer.config import check_config, load_config
from rlvr.utils.errors import ConfigError
from rlvr.workers.megatron import layout
from rlvr.workers.megatron.layout import (
    check_megatron_config,
    context_parallel_size,
    data_parallel_size,
    megatron_sizes,
    strategy_of,
)


def _config(*overrides: str):
    return load_config("grpo", ["trainer.backend=ray", "trainer.n_gpus_per_node=4", *overrides])


MEGATRON_ACTOR = ("actor_rollout_ref.actor.strategy=megatron", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2")


def test_unset_sizes_follow_the_actor_and_data_parallelism_takes_the_rest():
    cfg = _config(*MEGATRON_ACTOR, "critic.strategy=megatron")
    assert strategy_of(cfg, "ref") == "megatron" and megatron_sizes(cfg, "ref") == (2, 1)
    assert megatron_sizes(cfg, "critic") == (2, 1)
    assert data_parallel_size(cfg, "actor") == 2 and data_parallel_size(cfg, "critic") == 2
    fsdp_actor = _config("critic.strategy=megatron")
    assert megatron_sizes(fsdp_actor, "critic") == (1, 1) and data_parallel_size(fsdp_actor, "actor") == 4
    assert data_parallel_size(_config(*MEGATRON_ACTOR, "trainer.backend=local", "trainer.n_gpus_per_node=1"),
                              "actor") == 1  # the local backend's worker starts its model-parallel ranks itself
    assert strategy_of(_config("actor_rollout_ref.ref.strategy=megatron"), "ref") == "megatron"


def test_context_parallel_ranks_share_the_data_and_unset_sizes_follow_the_actor():
    cfg = _config("actor_rollout_ref.actor.strategy=megatron", "actor_rollout_ref.actor.megatron.context_parallel_size=2",
                  "critic.strategy=megatron", "trainer.n_gpus_per_node=8",
                  "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2")
    assert context_parallel_size(cfg, "actor") == 2 and context_parallel_size(cfg, "critic") == 2
    assert data_parallel_size(cfg, "actor") == 2  # 8 workers / (tp 2 x cp 2)
    assert context_parallel_size(_config("critic.strategy=megatron"), "critic") == 1  # an FSDP actor: 1


def test_the_config_check_names_the_key(monkeypatch):
    monkeypatch.setattr(layout, "megatron_installed", lambda: True)
    check_megatron_config(_config(*MEGATRON_ACTOR), ["actor", "ref"])
    cases = {
        ("actor_rollout_ref.actor.megatron.tensor_model_parallel_size=3",):
            ("actor_rollout_ref.actor.megatron.tensor_model_parallel_size", "4 workers"),
        ("actor_rollout_ref.ref.megatron.tensor_model_parallel_size=4",):
            ("actor_rollout_ref.ref.megatron.tensor_model_parallel_size",
             r"\(4, 1, 1, 4\) differ from the actor's \(2, 1, 1, 2\)"),
        ("actor_rollout_ref.model.lora_rank=8",): ("actor_rollout_ref.model.lora_rank", "FSDP engines' .peft. LoRA"),
        ("actor_rollout_ref.actor.megatron.context_parallel_size=4",):
            ("actor_rollout_ref.actor.megatron.tensor_model_parallel_size", "tensor_model_parallel_size=2 x "
                                                                             "context_parallel_size=4"),
        ("actor_rollout_ref.actor.megatron.context_parallel_size=0",):
            ("actor_rollout_ref.actor.megatron.context_parallel_size", "must be >= 1"),
        ("actor_rollout_ref.actor.megatron.context_parallel_size=2",
         "actor_rollout_ref.actor.megatron.expert_model_parallel_size=2"):
            ("actor_rollout_ref.actor.megatron.context_parallel_size",
             "with expert_model_parallel_size=2: rlvr's Megatron MoE"),
        ("actor_rollout_ref.ref.megatron.context_parallel_size=2",):
            ("actor_rollout_ref.ref.megatron.context_parallel_size", "context_parallel_size=2 differs from the actor's 1"),
    }
    for overrides, (key, message) in cases.items():
        with pytest.raises(ConfigError, match=message) as err:
            check_megatron_config(_config(*MEGATRON_ACTOR, *overrides), ["actor", "ref"])
        assert err.value.key == key


LORA = "actor_rollout_ref.model.lora"


def _with(cfg, **updates):
    """A copy of ``cfg`` with dotted-key ``updates`` (``__`` for dots): cheaper than loading a config."""
    out = copy.deepcopy(cfg)
    for key, value in updates.items():
        OmegaConf.update(out, key.replace("__", "."), value, merge=False)
    return out


def test_megatron_lora_runs_on_a_megatron_actor_and_the_rest_is_refused_with_its_reason(monkeypatch):
    monkeypatch.setattr(layout, "megatron_installed", lambda: True)
    cfg = _config(*MEGATRON_ACTOR, f"{LORA}.rank=16", f"{LORA}.alpha=32")
    check_megatron_config(cfg, ["actor"])
    assert layout.megatron_lora(cfg) and not layout.megatron_lora(_with(cfg, **{f"{LORA}.rank": 0}))
    lora = LORA.replace(".", "__")
    for extra in ({f"{lora}__type": "canonical_lora",
                   f"{lora}__target_modules": ["linear_q", "linear_v", "linear_fc1_up"]},
                  {f"{lora}__target_modules": [], f"{lora}__exclude_modules": ["linear_fc2"], f"{lora}__dropout": 0.1,
                   f"{lora}__dropout_position": "post", f"{lora}__lora_A_init_method": "kaiming",
                   f"{lora}__dtype": "float32"},
                  {f"{lora}__target_modules": ["*.layers.0.*.linear_qkv"]}):
        check_megatron_config(_with(cfg, **extra), ["actor"])
    cases = [  # (key, value): (the key the error names, its message)
        (("actor_rollout_ref.actor.strategy", "fsdp2"),
         (f"{LORA}.rank", "Megatron engine's LoRA .verl ignores it with FSDP.; with strategy=fsdp/fsdp2 set model.lora_rank")),
        ((f"{LORA}.type", "dora"), (f"{LORA}.type", r"type=dora: weight-decomposed LoRA \(DoRA\) is not in rlvr")),
        ((f"{LORA}.type", "vlm_lora"), (f"{LORA}.type", "vision-language models is not in rlvr")),
        (("critic.model.lora.rank", 4), ("critic.model.lora.rank", "Megatron LoRA is for the actor")),
        (("actor_rollout_ref.actor.megatron.override_transformer_config", {"sequence_parallel": True}),
            ("actor_rollout_ref.actor.megatron.override_transformer_config.sequence_parallel",
             "LoRA with sequence_parallel is not in rlvr")),
        ((f"{LORA}.type", "canonical_lora"),
         (LORA, "'linear_qkv' .a type=lora name.: type=canonical_lora takes linear_q")),
        ((f"{LORA}.target_modules", ["linear_q"]), (LORA, "'linear_q' .a type=canonical_lora name.: type=lora takes")),
        ((f"{LORA}.exclude_modules", ["linear_fc2"]), (LORA, r"exclude_modules needs target_modules=\[\]")),
        ((f"{LORA}.target_modules", []), (LORA, "target_modules is empty")),
        ((f"{LORA}.dropout_position", "middle"), (LORA, "dropout_position='middle': pre or post")),
        ((f"{LORA}.lora_B_init_method", "orthogonal"),
         (LORA, "lora_B_init_method='orthogonal': one of xavier, kaiming")),
        ((f"{LORA}.dropout", 1.0), (LORA, r"dropout=1.0: must be in \[0, 1\)")),
        ((f"{LORA}.dtype", "int8"), (LORA, "dtype='int8'")),
    ]
    for (path, value), (key, message) in cases:
        with pytest.raises(ConfigError, match=message) as err:
            check_megatron_config(_with(cfg, **{path.replace(".", "__"): value}), ["actor"])
        assert err.value.key == key, path


def test_megatron_without_megatron_core_says_how_to_install(monkeypatch):
    monkeypatch.setattr(layout, "megatron_installed", lambda: False)
    with pytest.raises(ConfigError, match=r"megatron-core, which is not installed: pip install 'rlvr\[megatron\]'") as err:
        check_config(load_config("grpo", ["critic.enable=true", "critic.strategy=megatron", "algorithm.adv_estimator=gae"]),
                     require_data_files=False)
    assert err.value.key == "critic.strategy"
    check_config(load_config("grpo", ["critic.strategy=megatron"]), require_data_files=False)  # no critic: nothing to install

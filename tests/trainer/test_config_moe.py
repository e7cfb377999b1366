"""Config checks of the mixture-of-experts keys: routing replay modes and where they apply, what the
rollout's routes need, R2's conflicts (verl's rules), expert parallelism, model.override_config."""

from __future__ import annotations

import pytest
from trainer_helpers import tiny_overrides

from rlvr.trainer.async_schedule import prox_log_prob_from_update
from rlvr.trainer.config import load_config
from rlvr.trainer.config.moe_checks import check_moe
from rlvr.trainer.config.validate import check_config
from rlvr.utils.errors import ConfigError
from rlvr.utils.model import load_causal_lm
from rlvr.utils.tiny_moe import save_tiny_moe
from rlvr.workers.megatron.layout import megatron_installed
from rlvr.workers.rollout.server.backend import LaunchSpec
from rlvr.workers.rollout.server.vllm_backend import VLLMServerBackend

ARR = "actor_rollout_ref"
ROUTES = {f"{ARR}.rollout.enable_rollout_routing_replay": True}


@pytest.fixture
def config(tiny_model_dir, tiny_data, tmp_path):
    def make(**extra):
        return load_config("grpo", tiny_overrides(tiny_model_dir, tiny_data, tmp_path / "run", **extra))

    return make


def _refused(cfg, key: str, words: str, check=check_config) -> None:
    with pytest.raises(ConfigError, match=words) as err:
        check(cfg)
    assert err.value.key == key


def test_routing_replay_settings_that_run_are_accepted(config):
    check_config(config(**ROUTES, **{f"{ARR}.actor.fsdp_config.router_replay.mode": "R3",
                                     f"{ARR}.rollout.moe_load_balance_metrics_interval": 5}))
    check_config(config(**{f"{ARR}.actor.fsdp_config.router_replay.mode": "R2"}))
    check_config(config(**ROUTES))  # the routes for the rollout/moe metrics only


@pytest.mark.megatron
@pytest.mark.skipif(not megatron_installed(), reason="the check of a Megatron role needs megatron-core")
def test_megatron_routing_replay_runs_on_one_stage(config):
    check_config(config(**{f"{ARR}.actor.strategy": "megatron", f"{ARR}.actor.megatron.router_replay.mode": "R2"}))
    _refused(config(**{f"{ARR}.actor.strategy": "megatron", f"{ARR}.actor.megatron.router_replay.mode": "R2",
                       f"{ARR}.actor.megatron.pipeline_model_parallel_size": 2}),
             f"{ARR}.actor.megatron.router_replay.mode", "replays routes on one stage holding every layer")


def test_modes_and_sections(config):
    _refused(config(**{f"{ARR}.actor.fsdp_config.router_replay.mode": "R1"}),
             f"{ARR}.actor.fsdp_config.router_replay.mode", "'R1' is not valid; use one of disabled, R2, R3")
    _refused(config(**{f"{ARR}.actor.megatron.router_replay.mode": "R2"}), f"{ARR}.actor.megatron.router_replay.mode",
             "only the actor replays routes, and it reads actor_rollout_ref.actor.fsdp_config.router_replay")
    _refused(config(**{"critic.fsdp_config.router_replay.mode": "R2"}), "critic.fsdp_config.router_replay.mode",
             "the reference and the critic route with their own routers")
    _refused(config(**{f"{ARR}.ref.megatron.router_replay.record_file": "/tmp/r.pt"}),
             f"{ARR}.ref.megatron.router_replay.record_file", "never reads or writes it")


def test_what_replaying_the_rollouts_routes_needs(config):
    r3 = {f"{ARR}.actor.fsdp_config.router_replay.mode": "R3"}
    _refused(config(**r3), f"{ARR}.rollout.enable_rollout_routing_replay", "R3 replays the rollout's routes")
    _refused(config(**ROUTES, **{f"{ARR}.actor.fsdp_config.router_replay.mode": "R2"}),
             f"{ARR}.rollout.enable_rollout_routing_replay", "R2 replays the routes of the actor's own")
    _refused(config(**ROUTES, **{f"{ARR}.rollout.compile": True, f"{ARR}.rollout.static_cache": True}),
             f"{ARR}.rollout.compile", "cannot record routes")
    _refused(config(**ROUTES, **{f"{ARR}.rollout.agent.default_agent_loop": "env_agent",
                                 f"{ARR}.rollout.multi_turn.env_name": "retry"}),
             f"{ARR}.rollout.agent.default_agent_loop", "only the single_turn loop")
    _refused(config(**{f"{ARR}.rollout.moe_load_balance_metrics_interval": 1}),
             f"{ARR}.rollout.moe_load_balance_metrics_interval", "count the rollout's routes")


def test_r2_needs_the_actors_log_prob_pass(config):
    r2 = {f"{ARR}.actor.fsdp_config.router_replay.mode": "R2"}
    _refused(config(**r2, **{"algorithm.rollout_correction.bypass_mode": True}),
             "algorithm.rollout_correction.bypass_mode", "bypass mode skips that forward")
    apart = {**r2, f"{ARR}.hybrid_engine": False, "async_training.mode": "one_step",
             f"{ARR}.actor.ppo_mini_batch_size": 4, "data.train_batch_size": 4}
    assert not prox_log_prob_from_update(config(**apart))
    assert prox_log_prob_from_update(config(**{**apart, **{f"{ARR}.actor.fsdp_config.router_replay.mode": "disabled"}}))


def test_expert_parallelism_of_the_rollout(config, tmp_path):
    key = f"{ARR}.rollout.expert_parallel_size"
    _refused(config(**{key: 2}), key, "expert parallelism is vLLM's")
    _refused(config(**{key: 0}), key, ">= 1")
    vllm = {f"{ARR}.rollout.name": "vllm", key: 2}
    _refused(config(**vllm), key, "for server replicas only", check_moe)  # vLLM: not in this venv
    servers = {**vllm, f"{ARR}.rollout.mode": "async", f"{ARR}.rollout.server.python": "python3"}
    _refused(config(**servers), key, "spans the tensor x data parallel ranks of one engine")
    check_moe(config(**servers, **{f"{ARR}.rollout.tensor_model_parallel_size": 2}))  # vLLM's TP: the scale checks
    launch = VLLMServerBackend().launch
    spec = LaunchSpec(python="python", model_dir=str(tmp_path), host="127.0.0.1", port=8000, api_key=None, seed=1,
                      dtype="bfloat16", cpu_bind=None, cuda_devices="0,1", kv_cache_gb=1, extra_args=[],
                      rollout=config(**servers, **{f"{ARR}.rollout.tensor_model_parallel_size": 2}).actor_rollout_ref.rollout)
    command, _ = launch(spec, {})
    assert "--enable-expert-parallel" in command and command[command.index("--tensor-parallel-size") + 1] == "2"
    spec.rollout.expert_parallel_size = 1
    assert "--enable-expert-parallel" not in launch(spec, {})[0]


def test_override_config_sets_the_hf_config(tmp_path):
    path = save_tiny_moe(tmp_path / "moe", "qwen2_moe")
    model = load_causal_lm(path, **{"router_aux_loss_coef": 0.25, "output_router_logits": True})
    assert model.config.router_aux_loss_coef == 0.25 and model.config.output_router_logits is True
    with pytest.raises(ValueError, match="override_config.no_such_field: the qwen2_moe config has no field"):
        load_causal_lm(path, no_such_field=1)

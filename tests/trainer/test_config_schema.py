"""The typed schema is the only config: every field is read by the code, every knob of a registered
loss or estimator is a schema field (settable from YAML and the command line, shown by
``--help-config``), and verl's keys are honoured, validated or explained."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import textwrap
import typing
from pathlib import Path

import numpy as np
import pytest
import torch
from schema_reads import fields_read

import rlvr
from rlvr.trainer.config import ActorConfig, AlgorithmConfig, PolicyLossConfig, RlvrConfig, help_config, load_config
from rlvr.trainer.config.schema import CriticConfig
from rlvr.trainer.config.suggest import schema_keys
from rlvr.trainer.config.validate_models import RM_SERVING_KNOBS
from rlvr.trainer.ppo import advantage, grpo_variants, optimal_baseline, policy_loss, trust_region_losses
from rlvr.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY
from rlvr.utils.errors import ConfigError

PACKAGE = Path(rlvr.__file__).parent
CONFIG_PACKAGE = PACKAGE / "trainer" / "config"
ESTIMATOR_DATA_INPUTS = {"token_level_rewards", "response_mask", "index", "values", "reward_baselines",
                         "old_log_prob", "old_log_probs", "rollout_log_prob", "sum_pi_squared", "rollout_is_weights",
                         "non_tensor_batch", "batch", "config", "kwargs"}
VERL_SIGNATURE_ONLY = {
    "epsilon": "numerical guard of the std / length divisions, a constant as in verl",
    "f_norm": "verl's GPG argument that its trainer never passes (the paper's optional std scaling)",
    "alpha": "verl's GPG argument; the estimator computes alpha from the batch",
    "handle_zero_tail": "verl's optimal-token-baseline argument that its trainer never passes (default on)",
}
VALIDATED_VERL_KEYS: dict[str, str] = {
    "actor_rollout_ref.actor.checkpoint.load_contents": "a resume restores the whole state; other contents refused",
    "critic.checkpoint.load_contents": "a resume restores the whole state; other contents refused",
    "critic.checkpoint.save_contents": "the critic's checkpoints are whole; hf_model refused (no HF form)",
    "critic.model.use_fused_kernels": "the critic computes values, no log-probs: true refused",
    "actor_rollout_ref.rollout.data_parallel_size": "in-process engines: a replica of tensor x data parallel workers "
    "is that many independent engines (a dense model), which the tensor-parallel placement makes anyway; servers: 1",
    "actor_rollout_ref.rollout.pipeline_model_parallel_size": "1 only: the rollout is split by tensor parallelism",
    **{f"reward.reward_model.rollout.{name}": "would configure or change verl's reward-model server; refused unless "
       "left at verl's default" for name in ("limit_images", "skip_tokenizer_init", "quantization",
                                             "quantization_config_file", "mtp", "disaggregation")},
    "reward.sandbox_fusion.url": "SandboxFusion's protocol; refused (route code to the code_sandbox reward worker)",
}
"""verl's keys that only validation reads: each has one value rlvr can run, and a config that asks
for another is rejected with the reason."""
RESOLVED_AT_LOAD = {
    "actor_rollout_ref.actor.ppo_micro_batch_size": "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size": "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.ref.log_prob_micro_batch_size": "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
    "critic.ppo_micro_batch_size": "critic.ppo_micro_batch_size_per_gpu",
    "critic.forward_micro_batch_size": "critic.forward_micro_batch_size_per_gpu",
}
"""verl's older global micro-batch sizes: finalize_config turns each into the per-rank key the code
reads (the value of the key it maps to)."""


def _interpolation_sources(schema: type, read: set[str]) -> set[str]:
    """Keys whose value reaches a read field through that field's default interpolation
    (``actor.use_fused_kernels = ${actor_rollout_ref.model.use_fused_kernels}``)."""
    import re

    defaults = {key: value for key, value in _schema_defaults(schema).items() if isinstance(value, str)}
    return {source for key, value in defaults.items() if key in read
            for source in re.findall(r"\$\{(?:oc\.select:)?([\w.]+)[,}]", value)}


def _schema_defaults(schema: type, prefix: str = "") -> dict:
    """Dotted leaf -> default of every field of ``schema``."""
    out = {}
    hints = typing.get_type_hints(schema)
    for fld in dataclasses.fields(schema):
        key, hint = f"{prefix}{fld.name}", hints[fld.name]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            out.update(_schema_defaults(hint, f"{key}."))
        elif fld.default is not dataclasses.MISSING:
            out[key] = fld.default
    return out


VALIDATION_MODULES = [CONFIG_PACKAGE / "validate.py", CONFIG_PACKAGE / "validate_verl.py",
                      CONFIG_PACKAGE / "validate_rollout_scale.py", CONFIG_PACKAGE / "validate_models.py",
                      CONFIG_PACKAGE / "validate_profiler.py", CONFIG_PACKAGE / "moe_checks.py"]
NOTED_VERL_KEYS = {
    *(f"reward.reward_model.rollout.{name}" for name in RM_SERVING_KNOBS),
    "reward.sandbox_fusion.max_concurrent", "reward.sandbox_fusion.memory_limit_mb", "distillation.teacher_key",
}
"""verl's serving knobs that are accepted without effect, each with a start-up note when set
(:func:`rlvr.trainer.config.validate_models.frozen_model_notes`, tested in test_config_reward_model)."""
_ROUTER_REPLAY_SECTIONS = [f"{role}.{backend}.router_replay" for role in ("actor_rollout_ref.actor",
                                                                          "actor_rollout_ref.ref", "critic")
                           for backend in ("fsdp_config", "megatron")]
VALIDATED_VERL_KEYS.update({
    f"{section}.{name}": "verl defines the file but never reads or writes it; rlvr keeps routes in the batch"
    for section in _ROUTER_REPLAY_SECTIONS for name in ("record_file", "replay_file")
})
VALIDATED_VERL_KEYS.update({
    key: "a setting of a profiler tool rlvr refuses (nsys, npu, precision_debugger) or of verl's mini-batch "
         "schedule, accepted at its default only; a role's torch_memory settings must equal the global ones"
    for key in schema_keys(RlvrConfig)
    if ("profiler." in key and any(f".{part}." in key for part in ("nsys", "npu", "precision_debugger", "schedule")))
    or ".profiler.tool_config.torch_memory." in key or key == "global_profiler.global_tool_config.torch_memory.stack_depth"})


def _code_files() -> list[Path]:
    """rlvr's modules outside the config package: what the config package does with a key (its
    schema, defaults and validation) does not make the key do anything."""
    return [path for path in PACKAGE.rglob("*.py") if CONFIG_PACKAGE not in path.parents]


@functools.cache
def _read_by_the_code(schema: type) -> dict[str, set[str]]:
    return fields_read(_code_files(), schema)


def _dead_keys(schema: type = RlvrConfig) -> list[str]:
    read = set(_read_by_the_code(schema))
    read |= {key for key, target in RESOLVED_AT_LOAD.items() if target in read}
    read |= _interpolation_sources(schema, read)
    return [key for key in schema_keys(schema)
            if key not in read and key not in VALIDATED_VERL_KEYS and key not in NOTED_VERL_KEYS]


def test_every_schema_field_is_read_by_the_code():
    """A field no code reads is a dead key: a user sets it and nothing happens. A field counts as
    read only where the code reads that field of that section (``schema_reads`` says how)."""
    assert _dead_keys() == []


def test_the_validated_verl_keys_are_validated_and_read_nowhere_else():
    validated = fields_read(VALIDATION_MODULES, RlvrConfig)
    assert [key for key in VALIDATED_VERL_KEYS if key not in validated] == []
    assert [key for key in VALIDATED_VERL_KEYS if key in _read_by_the_code(RlvrConfig)] == []


@dataclasses.dataclass
class _CriticWithDeadKeys(CriticConfig):
    num_examine: int = 0
    name: str = ""


@dataclasses.dataclass
class _WithDeadKeys(RlvrConfig):
    critic: _CriticWithDeadKeys = dataclasses.field(default_factory=_CriticWithDeadKeys)
    dataloader_num_workers_never_read: int = 0


def test_the_dead_key_check_catches_a_dead_key():
    """Dead keys named like keys that other sections' code reads (``num_examine``, ``name``) are caught."""
    assert _dead_keys(_WithDeadKeys) == ["critic.num_examine", "critic.name", "dataloader_num_workers_never_read"]


def test_a_field_counts_as_read_only_in_its_own_section(tmp_path):
    """What the check sees in code like rlvr's before the critic read its tokenizer: the actor's
    ``model.tokenizer_path`` is read, the critic's only written; aliases, ``self`` attributes and
    annotations lead each chain to its section."""
    code = tmp_path / "code.py"
    code.write_text(textwrap.dedent('''
        def finalize(cfg):
            critic_model, actor_model = cfg.critic.model, cfg.actor_rollout_ref.model
            critic_model.tokenizer_path = actor_model.tokenizer_path

        class Worker:
            def __init__(self, config):
                self.config = config

            def init_model(self):
                cfg = self.config.actor_rollout_ref
                return cfg.model.path, self.config.trainer.seed

        def reward_worker_config(cfg, name) -> RewardWorkerConfig:
            config = make(cfg.reward.workers, name)
            if config.tokenizer_path is None:
                config.tokenizer_path = "policy"
            return config

        def sample(rollout_config, validate):
            source = rollout_config.val_kwargs if validate else rollout_config
            return source.top_k

        def _algo(config) -> AlgorithmConfig:
            return config

        def returns(config=None):
            return _algo(config).gamma

        class Loop:
            def __init__(self, rollout_config):
                self.settings = rollout_config.multi_turn

            def run(self):
                return self.settings.env_kwargs
    '''))
    read = fields_read([code], RlvrConfig)
    assert "actor_rollout_ref.model.tokenizer_path" in read and "critic.model.tokenizer_path" not in read
    assert "reward.workers.math_rule.tokenizer_path" in read
    assert {"actor_rollout_ref.model.path", "trainer.seed", "actor_rollout_ref.rollout.top_k",
            "actor_rollout_ref.rollout.val_kwargs.top_k", "algorithm.gamma",
            "actor_rollout_ref.rollout.multi_turn.env_kwargs"} <= set(read)
    assert not {"critic.model.path", "data.seed", "reward.route_key"} & set(read)


class _Recorder:
    """A schema section that records which fields are read; a field the schema lacks raises
    ``AttributeError`` (dataclasses have no fallback)."""

    def __init__(self, section: object, path: str, log: set[str]) -> None:
        self._section, self._path, self._log = section, path, log

    def __getattr__(self, name: str):
        value = getattr(self._section, name)
        self._log.add(f"{self._path}.{name}")
        return _Recorder(value, f"{self._path}.{name}", self._log) if dataclasses.is_dataclass(value) else value


def _builtin(registry: dict, *modules) -> dict:
    return {name: fn for name, fn in registry.items() if fn.__module__ in {module.__name__ for module in modules}}


def test_every_policy_loss_knob_is_a_field_of_the_actor_section():
    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(4, 6, generator=gen) * 2
    new, adv = old + 0.1 * torch.randn(4, 6, generator=gen), torch.randn(4, 6, generator=gen)
    read: set[str] = set()
    # (bypass_mode reads verl's rollout_correction section, which verl's trainer puts in policy_loss and a run
    # config refuses: rlvr applies bypass mode with any loss)
    for name, loss in _builtin(POLICY_LOSS_REGISTRY, policy_loss, trust_region_losses).items():
        assert list(inspect.signature(loss).parameters) == [  # verl 0.9's positional order
            "old_log_prob", "log_prob", "advantages", "response_mask", "loss_agg_mode", "config", "rollout_is_weights"]
        config = ActorConfig(policy_loss=PolicyLossConfig(dro_beta=0.1))
        loss(old, new, adv, torch.ones(4, 6), "token-mean", _Recorder(config, "actor", read), None)
    assert {key for key in read if key.startswith("actor.policy_loss.")} == {
        f"actor.policy_loss.{key}" for key in schema_keys(PolicyLossConfig) if key != "loss_mode"}
    assert {"actor.clip_ratio", "actor.clip_ratio_low", "actor.clip_ratio_high", "actor.clip_ratio_c",
            "actor.global_batch_info", "actor.tau_pos", "actor.tau_neg"} <= read


def test_every_estimator_knob_is_a_field_of_the_algorithm_section():
    gen = torch.Generator().manual_seed(0)
    rewards, mask = torch.rand(6, 4, generator=gen), torch.ones(6, 4)
    old_log_prob = -torch.rand(6, 4, generator=gen)
    inputs = dict(token_level_rewards=rewards, response_mask=mask, values=torch.rand(6, 4, generator=gen),
                  index=np.array(["a", "a", "b", "b", "c", "c"], dtype=object), reward_baselines=torch.rand(6),
                  old_log_prob=old_log_prob, old_log_probs=old_log_prob, rollout_log_prob=None,
                  sum_pi_squared=old_log_prob.exp().square(), rollout_is_weights=None,
                  non_tensor_batch={"format": np.arange(6.0)}, batch={})
    fields = {f.name for f in dataclasses.fields(AlgorithmConfig)}
    read: set[str] = set()
    for name, estimator in _builtin(ADV_ESTIMATOR_REGISTRY, advantage, grpo_variants, optimal_baseline).items():
        for param in inspect.signature(estimator).parameters:
            assert param in ESTIMATOR_DATA_INPUTS | fields | set(VERL_SIGNATURE_ONLY), (name, param)
        estimator(**inputs, config=_Recorder(AlgorithmConfig(gdpo_reward_keys=["format"]), "algorithm", read))
    knobs = {"gamma", "lam", "norm_adv_by_std_in_grpo", "singleton_advantage", "gpg_alpha_count", "egpo_alpha",
             "egpo_beta", "egpo_correct_threshold", "egpo_uncertainty_norm", "gdpo_reward_keys", "gdpo_reward_weights"}
    assert {key.split(".", 1)[1] for key in read} == knobs


def test_loss_and_estimator_knobs_are_settable_from_the_command_line():
    cfg = load_config("grpo", [
        "actor_rollout_ref.actor.policy_loss.loss_mode=gspo", "actor_rollout_ref.actor.clip_ratio_low=3e-4",
        "actor_rollout_ref.actor.clip_ratio_high=4e-4", "actor_rollout_ref.actor.policy_loss.ppo_kl_coef=0.5",
        "algorithm.singleton_advantage=zero", "algorithm.gpg_alpha_count=informative"])
    actor, algo = cfg.actor_rollout_ref.actor, cfg.algorithm
    old, new = torch.zeros(1, 2), torch.full((1, 2), 0.001)  # sequence ratio exp(0.001) > 1 + 4e-4
    loss, metrics = POLICY_LOSS_REGISTRY[actor.policy_loss.loss_mode](old, new, torch.ones(1, 2), torch.ones(1, 2),
                                                                      "seq-mean-token-mean", actor)
    assert metrics["pg_clipfrac"].item() == 1.0
    assert loss.item() == pytest.approx(-(1 + 4e-4))
    rewards = torch.tensor([[1.0], [0.0], [1.0], [1.0], [1.0]])
    index = np.array(["a", "a", "b", "b", "c"], dtype=object)
    adv, _ = ADV_ESTIMATOR_REGISTRY["gpg"](rewards, torch.ones(5, 1), index, config=algo)
    assert adv.flatten().tolist() == [1.25, -1.25, 0.0, 0.0, 0.0]  # alpha = 5 / 2 informative rows; c alone: 0
    text = help_config()
    for key in ("actor_rollout_ref.actor.policy_loss.ppo_kl_coef = 0.1", "algorithm.singleton_advantage = None",
                "algorithm.gpg_alpha_count = 'nonzero_score'", "actor_rollout_ref.actor.clip_ratio_low = None"):
        assert f"  {key}\n" in text


def test_verl_keys_without_meaning_here_are_accepted_and_say_why(caplog):
    """verl's DataLoader workers are a speed switch rlvr has no use for (a start-up note); the
    reference's optimizer offload has nothing to offload (accepted silently, see docs/verl_compat.md)."""
    import logging

    with caplog.at_level(logging.WARNING, logger="rlvr.config"):
        load_config("grpo", ["data.dataloader_num_workers=4", "actor_rollout_ref.ref.fsdp_config.optimizer_offload=true"])
    assert [r.getMessage() for r in caplog.records] == [
        "note: data.dataloader_num_workers=4 has no effect in rlvr: rlvr tokenizes the prompts once when the dataset "
        "loads and builds each batch in the driver, so there are no DataLoader workers"]

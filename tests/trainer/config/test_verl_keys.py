"""Every key of verl 0.9.1's generated configs is accepted and does what its row in
docs/verl_compat.md says: honoured keys reach the schema field, aliases move, pending keys name
their issue, refused keys refuse other values with the reason, noted keys print a start-up note."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
from verl_files import LOCAL, NAMES, generated, write_user_config

from rlvr.trainer.config import check_config, check_names, load_config
from rlvr.trainer.config.builtin_names import BUILTIN_NAMES
from rlvr.trainer.config.loader import schema_shape
from rlvr.trainer.config.verl_keys import key_status
from rlvr.trainer.config.verl_pending import ANY, PENDING, pending_rule
from rlvr.trainer.config.verl_rules import RULES, alias_for, rule_for
from rlvr.utils.errors import ConfigError
from rlvr.workers.megatron.layout import megatron_installed

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))
import verl_key_table  # noqa: E402

SET_BY_FINALIZE = {"actor_rollout_ref.rollout.prompt_length", "actor_rollout_ref.rollout.response_length",
                   "data.seed", "critic.model.path", "critic.model.tokenizer_path", "critic.enable",
                   "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
                   "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "critic.ppo_micro_batch_size_per_gpu",
                   "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "critic.forward_micro_batch_size_per_gpu"}
"""Schema fields that finalize_config fills (micro-batch sizes: verl's null is "the whole batch")."""
LEGACY_UNSET = {"reward_model.reward_manager", "reward_model.num_workers"}
"""verl's legacy reward keys, null ("unset") in the generated configs: the reward-key migration gives
them rlvr's defaults (naive, 2 processes) unless verl's new reward section names a manager."""


@pytest.fixture(scope="module")
def verl_configs(tiny_model_dir, tiny_data, tmp_path_factory):
    folder = tmp_path_factory.mktemp("verl_configs")
    return {name: (folder, write_user_config(name, folder, tiny_model_dir, tiny_data["train"]).stem) for name in NAMES}


def test_the_doc_table_lists_every_key_with_its_status():
    """docs/verl_compat.md holds the table that scripts/verl_key_table.py writes, and no key of
    either generated config is unknown to rlvr."""
    rows = verl_key_table.rows()
    keys = set(generated("ppo_trainer")) | set(generated("ppo_megatron_trainer"))
    assert {row[0] for row in rows} == keys and len(keys) == 1089
    assert [row[0] for row in rows if row[2] == "UNKNOWN"] == []
    assert verl_key_table.table() in verl_key_table.DOC.read_text()


NEEDS_MEGATRON = pytest.mark.skipif(not megatron_installed(), reason="the check of a Megatron role needs megatron-core "
                                    "(make test-megatron installs it)")


@pytest.mark.parametrize("name", [pytest.param(name, marks=[NEEDS_MEGATRON, pytest.mark.megatron]) if "megatron" in name
                                  else name
                                  for name in NAMES])
def test_a_generated_config_passes_the_check_and_its_values_reach_the_schema(verl_configs, name, caplog):
    folder, config_name = verl_configs[name]
    with caplog.at_level(logging.WARNING, logger="rlvr.config"):
        cfg = load_config(None, [], config_name=config_name, config_path=str(folder))
    assert caplog.records == []  # verl's defaults are no-op values of every noted switch
    check_config(cfg)
    check_names(cfg, BUILTIN_NAMES)
    shape = schema_shape()
    for key, value in generated(name).items():
        if key in shape.leaves and key not in SET_BY_FINALIZE | LEGACY_UNSET | set(LOCAL) and "${" not in str(value) \
                and value != "???" \
                and pending_rule(key) is None and not key.endswith(("model.path", "_files")):
            assert cfg_value(cfg, key) == value, key
    assert cfg.actor_rollout_ref.actor.strategy == ("megatron" if name == "ppo_megatron_trainer" else "fsdp")
    if name == "ppo_trainer":
        assert cfg.critic.fsdp_config.dtype == "bfloat16"  # verl's critic.fsdp, moved to rlvr's name
    else:
        assert cfg.critic.megatron.dtype == "bfloat16" and cfg.critic.megatron.seed == 42


def cfg_value(cfg, key):
    from omegaconf import OmegaConf

    value = OmegaConf.select(cfg, key)
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def _load(overrides, **kwargs):
    return load_config(None, list(overrides), **kwargs)


@pytest.mark.parametrize(("override", "issue"), [
    ("actor_rollout_ref.actor.megatron.dynamic_context_parallel=true", 42),
    ("actor_rollout_ref.actor.megatron.max_seqlen_per_dp_cp_rank=4096", 42),
])
def test_a_pending_key_is_refused_naming_its_issue(override, issue):
    with pytest.raises(ConfigError, match=f"issue {issue} builds it"):
        _load([override])


@pytest.mark.parametrize("override", [
    "actor_rollout_ref.actor.megatron.dynamic_context_parallel=false",
    "actor_rollout_ref.actor.megatron.max_seqlen_per_dp_cp_rank=null",
])
def test_a_pending_key_at_what_rlvr_does_today_is_accepted(override):
    cfg = _load([override])
    assert override.lstrip("+").split("=")[0].rpartition(".")[2] not in cfg.actor_rollout_ref.actor.megatron  # dropped


def _other_value(inert: tuple):
    """A value outside ``inert`` of the same kind."""
    sample = next((v for v in inert if v is not None and v is not ANY), None)
    if isinstance(sample, bool):
        return not sample
    if isinstance(sample, (int, float)):
        return sample + 7
    if isinstance(sample, dict):
        return {"x": 1}
    return "something-else"


def _example_key(pattern: str) -> str | None:
    keys = sorted(set(generated("ppo_trainer")) | set(generated("ppo_megatron_trainer")))
    return next((key for key in keys if not key.endswith("._target_") and rule_for(key) is not None
                 and rule_for(key).pattern == pattern), None)


def _translate(leaves: dict):
    """The translation step alone (what load_config runs on the composed config)."""
    from omegaconf import OmegaConf

    from rlvr.trainer.config.verl_translate import translate, unflatten

    return translate(OmegaConf.create(unflatten(leaves)), schema_shape())


def test_every_refused_key_refuses_another_value_with_its_reason():
    """For each refused rule with an example key in verl's configs: the key with a value outside its
    accepted values (and its gate on) is refused, the message giving the rule's reason; at an
    accepted value it is dropped."""
    checked = 0
    for rule in (r for r in RULES if r.kind == "refused"):
        key = _example_key(rule.pattern)
        if key is None:
            continue
        leaves = {}
        if rule.gate is not None:
            gate_key = _example_key_for(rule.gate[0])
            gate_rule = rule_for(gate_key)
            if gate_rule is not rule and gate_rule is not None and gate_rule.kind == "refused":
                continue  # turning the gate on is refused by the gate key's own rule (checked with it)
            leaves[gate_key] = _other_value(rule.gate[1])
        if key not in leaves:
            leaves[key] = _other_value(rule.inert) if rule.inert else "something-else"
        with pytest.raises(ConfigError, match=_escaped(rule.reason[:40])):
            _translate(leaves)
        if rule.inert and rule.gate is None:
            assert _translate({key: rule.inert[0]})[0] == {}
        checked += 1
    assert checked >= 35


def _example_key_for(pattern: str) -> str:
    from fnmatch import fnmatchcase

    keys = sorted(set(generated("ppo_trainer")) | set(generated("ppo_megatron_trainer")))
    return next(key for key in keys if fnmatchcase(key, pattern) and not key.endswith("._target_"))


def _yaml(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{v}" for k, v in value.items()) + "}"
    return str(value)


def _escaped(text: str) -> str:
    import re

    return re.escape(text)


def test_a_noted_switch_prints_one_note_and_changes_nothing(caplog):
    baseline = _load([])
    with caplog.at_level(logging.WARNING, logger="rlvr.config"):
        cfg = _load(["data.dataloader_num_workers=4", "actor_rollout_ref.model.use_liger=true"])
    notes = [record.getMessage() for record in caplog.records]
    assert len(notes) == 2 and all("has no effect in rlvr" in note for note in notes)
    assert "data.dataloader_num_workers=4" in notes[0] and "use_liger=True" in notes[1]
    assert cfg == baseline


def test_verl_names_move_to_rlvr_fields_and_two_values_are_refused():
    cfg = _load(["++critic.fsdp.param_offload=true", "actor_rollout_ref.actor.optim.lr_warmup_steps=5",
                 "actor_rollout_ref.actor.optim.warmup_style=cosine", "actor_rollout_ref.actor.use_prefix_grouper=true",
                 "actor_rollout_ref.rollout.multi_turn.max_tool_response_length=64",
                 "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false"])
    assert cfg.critic.fsdp_config.param_offload is True
    assert cfg.actor_rollout_ref.actor.optim.warmup_steps == 5
    assert cfg.actor_rollout_ref.actor.optim.lr_scheduler_type == "cosine"
    assert cfg.actor_rollout_ref.rollout.multi_turn.max_tool_response_tokens == 64
    assert _load(["actor_rollout_ref.actor.optim.lr_warmup_steps=-1"]).actor_rollout_ref.actor.optim.warmup_steps == 0
    with pytest.raises(ConfigError, match="is verl's name of actor_rollout_ref.actor.optim.warmup_steps, which is "
                                          "set to 3"):
        _load(["actor_rollout_ref.actor.optim.lr_warmup_steps=5", "actor_rollout_ref.actor.optim.warmup_steps=3"])


def test_derived_keys_must_equal_their_source():
    _load(["actor_rollout_ref.actor.rollout_n=4", "actor_rollout_ref.rollout.n=4"])
    with pytest.raises(ConfigError, match="verl copies it from actor_rollout_ref.rollout.n"):
        _load(["actor_rollout_ref.actor.rollout_n=3"])


def test_target_keys_of_verl_classes_are_dropped_and_others_refused():
    _load(["++actor_rollout_ref.actor._target_=verl.workers.config.FSDPActorConfig"])
    with pytest.raises(ConfigError, match="rlvr builds every section as its own typed config"):
        _load(["++actor_rollout_ref.actor._target_=my_pkg.MyActorConfig"])


def test_every_pending_rule_and_rule_has_a_generated_key_or_a_reason():
    """The rule tables name real verl keys (a pattern no generated key matches must be one of the
    keys verl's launch scripts add themselves)."""
    added_by_scripts = {"*.moe_*", "*.megatron.grad_offload"}  # verl's older key, still in its Megatron scripts
    keys = set(generated("ppo_trainer")) | set(generated("ppo_megatron_trainer"))
    keys |= {alias_for(key)[1] for key in keys if alias_for(key) is not None}  # critic.fsdp is critic.fsdp_config
    from fnmatch import fnmatchcase

    for pattern in [rule.pattern for rule in PENDING] + [rule.pattern for rule in RULES]:
        assert pattern in added_by_scripts or any(fnmatchcase(key, pattern) for key in keys), pattern


def test_key_status_matches_the_loader_for_honoured_keys():
    shape = schema_shape()
    status = key_status("actor_rollout_ref.rollout.calculate_log_probs", shape.helps, shape.defaults, True)
    assert status.status == "honoured"
    assert key_status("trainer.balance_batch", shape.helps, shape.defaults).status == "honoured"
    status = key_status("actor_rollout_ref.actor.megatron.dynamic_context_parallel", shape.helps, shape.defaults)
    assert status.status == "pending: issue 42"
    assert key_status("actor_rollout_ref.actor.qat.enable", shape.helps, shape.defaults).status == "refused"


@pytest.mark.parametrize(("overrides", "path"), [
    ([], "none to push: the HF engine shares the actor's module"),
    (["actor_rollout_ref.rollout.dtype=bfloat16"], "copied in place into each worker's HF engine copy"),
    (["trainer.backend=ray", "trainer.n_gpus_per_node=2"], "copied in place into each worker's HF engine copy"),
    (["actor_rollout_ref.hybrid_engine=false", "async_training.mode=one_step", "trainer.backend=local"],
     "through shared memory to the rollout child process"),
    (["actor_rollout_ref.hybrid_engine=false", "async_training.mode=one_step", "trainer.backend=ray"],
     "through the Ray object store to the rollout workers"),
])
def test_checkpoint_engine_backends_map_to_rlvrs_push(overrides, path):
    from rlvr.trainer.run_settings import weight_push

    naive = weight_push(_load(overrides))
    assert naive.startswith(path) and "backend=naive: rlvr's push above is that in-process" in naive
    nccl = weight_push(_load([*overrides, "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"]))
    assert nccl.startswith(path) and "backend=nccl: its transfer engine is a library rlvr does not use" in nccl
    with pytest.raises(ConfigError, match="Ascend NPUs"):
        check_config(_load(["actor_rollout_ref.rollout.checkpoint_engine.backend=hccl"]), require_data_files=False)


@NEEDS_MEGATRON
@pytest.mark.megatron
def test_dist_checkpointing_needs_a_megatron_role_and_a_checkpoint_folder(tmp_path):
    """use_dist_checkpointing is honoured (tests/workers/test_megatron_verl_keys.py); the check
    refuses it where it could not be."""
    key = "actor_rollout_ref.actor.megatron"
    (tmp_path / ".metadata").write_bytes(b"")
    ok = ["actor_rollout_ref.actor.strategy=megatron", "critic.strategy=megatron", f"{key}.use_dist_checkpointing=true",
          f"{key}.dist_checkpointing_path={tmp_path}"]
    check_config(_load(ok), require_data_files=False)
    for overrides, message in ((ok[2:], "this role runs strategy=fsdp2"), (ok[:3], "needs the checkpoint folder"),
                               ([*ok[:3], f"{key}.dist_checkpointing_path={tmp_path / 'no'}"], "no .metadata file")):
        with pytest.raises(ConfigError, match=message):
            check_config(_load(overrides), require_data_files=False)

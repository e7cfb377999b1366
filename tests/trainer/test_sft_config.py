"""The SFT trainer's config: every key of verl 0.9.1's composed ``sft_trainer_engine.yaml`` loads (as a
user YAML on the defaults) and passes the check once the documented differences are set; each
refused setting names its key and what to do; speed switches are noted; Hydra's override grammar and
verl's config-group selections."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf
from schema_reads import fields_read
from verl_sft_defaults import VERL_SFT_DEFAULTS

import rlvr
from rlvr.trainer.config import sft_check
from rlvr.trainer.config.sft_check import check_sft_config, load_sft_config
from rlvr.trainer.config.sft_schema import SFTConfig
from rlvr.trainer.config.suggest import schema_keys
from rlvr.utils.errors import ConfigError

SUBORDINATE = {  # keys that mean something only when the switch beside them is on
    "model.fused_kernel_options": "model.use_fused_kernels", "model.tiled_mlp.num_shards": "model.tiled_mlp.enabled",
    "engine.entropy_from_logits_chunk_size": "engine.entropy_from_logits_with_chunking",
    "engine.pad_to_length_bucket": "engine.pad_to_length",
    **{f"profiler.{key}": "profiler.enable" for key in ("tool", "all_ranks", "ranks", "save_path", "relocate_results",
                                                        "finish_hook_cmd", "finish_hook_all_ranks", "finish_hook_ranks",
                                                        "tool_config")},
}


def leaf_keys(node: dict, prefix: str = "") -> list[str]:
    keys = []
    for key, value in node.items():
        keys += leaf_keys(value, f"{prefix}{key}.") if isinstance(value, dict) and value else [f"{prefix}{key}"]
    return keys


@pytest.fixture
def chats(tmp_path):
    path = tmp_path / "chats.jsonl"
    path.write_text('{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}\n')
    return str(path)


def verl_yaml(tmp_path, chats, **changes) -> str:
    """verl's whole default config as a user YAML, with ``changes`` (dotted key -> value)."""
    config = copy.deepcopy(VERL_SFT_DEFAULTS)
    for key, value in {"data.train_files": chats, **changes}.items():
        *parents, leaf = key.split(".")
        node = config
        for part in parents:
            node = node[part]
        node[leaf] = value
    path = tmp_path / "verl_sft.yaml"
    path.write_text(yaml.safe_dump({"defaults": ["sft_trainer_engine", {"engine@engine": "fsdp"}, "_self_"], **config}))
    return str(path)


def test_every_verl_key_loads_and_checks(tmp_path, chats):
    """The differences rlvr documents: the device (verl's cuda), the logger (verl's wandb), and the
    compute dtype (verl's bfloat16 on fp32 parameters is mixed precision, refused)."""
    path = verl_yaml(tmp_path, chats, **{"trainer.device": "cpu", "trainer.logger": ["console"], "engine.dtype": None})
    cfg = load_sft_config([], path)
    loaded = OmegaConf.to_container(cfg)
    for key in leaf_keys(VERL_SFT_DEFAULTS):
        assert OmegaConf.select(cfg, key, default="MISSING") != "MISSING", key
    assert loaded["optim"]["betas"] == [0.9, 0.999] and loaded["engine"]["qat"]["mode"] == "w4a16"
    notes = check_sft_config(cfg)
    assert notes == ["engine.use_torch_compile=True: no effect in rlvr (the SFT forward runs eagerly; the numbers "
                     "are the same)"]
    with pytest.raises(ConfigError, match="'engine.dtype': 'bfloat16' compute on fp32 parameters is mixed precision"):
        check_sft_config(load_sft_config([], verl_yaml(tmp_path, chats, **{"trainer.device": "cpu"})))
    assert check_sft_config(load_sft_config(["engine.model_dtype=bf16"], path)) == notes  # bf16 throughout: fine


@pytest.mark.parametrize(("override", "key", "reason"), [
    ("engine.strategy=megatron", "engine.strategy", "runs fsdp | fsdp2"),
    ("engine.fsdp_size=2", "engine.fsdp_size", "HSDP groups are not available"),
    ("model.override_config={attention_dropout: 0.1}", "model.override_config", "save the model with the changed"),
    ("model.lora_adapter_path=/a", "model.lora_adapter_path", "merge it into the model first"),
    ("+model.lora.rank=8", "model.lora.rank", "Megatron's LoRA section"),
    ("optim.num_cycles=1.0", "optim.num_cycles", "one half-cosine down"),
    ("optim.optimizer=SGD", "optim.optimizer", "rlvr trains with AdamW"),
    ("optim.warmup_style=linear", "optim.lr_scheduler_type", "use constant or cosine"),
    ("data.balance_dp_token=true", "data.balance_dp_token", "verl does not implement it either"),
    ("checkpoint.save_contents=[model]", "checkpoint.save_contents", "always hold model, optimizer and extra"),
    ("trainer.default_hdfs_dir=hdfs://x", "trainer.default_hdfs_dir", "rlvr does not copy to HDFS"),
    ("trainer.save_freq=every", "trainer.save_freq", "after_each_epoch"),
    ("data.train_batch_size=3", None, None),
])
def test_refused_settings_name_the_key(chats, override, key, reason):
    cfg = load_sft_config([f"data.train_files={chats}", "trainer.n_gpus_per_node=2", "trainer.backend=process",
                           "data.train_batch_size=4", override])
    if key is None:  # 3 conversations over 2 ranks
        with pytest.raises(ConfigError, match="'data.train_batch_size': 3 conversations do not split evenly over 2"):
            check_sft_config(cfg)
        return
    with pytest.raises(ConfigError, match=f"^config error at '{key}': .*{reason}"):
        check_sft_config(cfg)


def test_hydra_grammar_groups_and_suggestions(chats):
    cfg = load_sft_config([f"data.train_files={chats}", "engine=fsdp", "optim=fsdp", "+trainer.logger=console",
                           "++optim.betas=[0.8,0.95]", "trainer.save_freq=after_each_epoch", "data.num_workers=2"])
    assert list(cfg.trainer.logger) == ["console"] and list(cfg.optim.betas) == [0.8, 0.95]
    assert check_sft_config(cfg)[0].startswith("data.num_workers=2: no effect in rlvr")
    with pytest.raises(ConfigError, match="'engine': verl's engine config 'megatron' .* use engine=fsdp"):
        load_sft_config(["engine=megatron"])
    with pytest.raises(ConfigError, match="'data.micro_batch_size': unknown key .*did you mean 'data.micro_batch_size_per_gpu'"):
        load_sft_config(["data.micro_batch_size=4"])
    with pytest.raises(ConfigError, match="'trainer.total_epochs': wrong value"):
        load_sft_config(["trainer.total_epochs=many"])
    with pytest.raises(ConfigError, match="under torchrun every process is a rank already"):
        check_sft_config(load_sft_config([f"data.train_files={chats}", "trainer.backend=local"]), launched_ranks=2)


def test_no_key_is_silently_ignored():
    """Every key is read by the trainer's code, or by the check (refused when set to what rlvr cannot
    do, or noted as a speed switch), or is a setting of a switch that is."""
    package = Path(rlvr.__file__).parent
    code = [p for p in package.rglob("*.py") if package / "trainer" / "config" not in p.parents]
    read = fields_read([*code, Path(sft_check.__file__)], SFTConfig)
    covered = set(read) | set(sft_check._SPEED_SWITCHES)
    assert [key for key in schema_keys(SFTConfig) if key not in covered and key not in SUBORDINATE] == []
    assert all(SUBORDINATE[key] in covered for key in SUBORDINATE)

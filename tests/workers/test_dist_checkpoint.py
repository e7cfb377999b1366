"""Reading a Megatron distributed checkpoint into Hugging Face tensors (verl's
``megatron.use_dist_checkpointing``), pure torch: a checkpoint in megatron-core's layout (stacked
layers, transformer-engine's layer-norm names, a padded vocabulary, a name prefix) written with
torch's distributed-checkpoint writer gives back the HF weights exactly. The end-to-end run with a
checkpoint megatron-core itself wrote is in ``test_megatron_verl_keys.py``."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.distributed.checkpoint import FileSystemWriter, save
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlvr.workers.megatron.dist_checkpoint import hf_state_from_megatron, load_dist_checkpoint, read_dist_checkpoint
from rlvr.workers.megatron.hf_mapping import LlamaShape, stage_rules

TE = {"input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
      "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight"}


def _qwen2() -> Qwen2ForCausalLM:
    torch.manual_seed(3)
    config = Qwen2Config(vocab_size=30, hidden_size=8, intermediate_size=16, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    return Qwen2ForCausalLM(config).eval()


def _megatron_checkpoint(model, folder, prefix: str = "", pad_to: int = 32) -> None:
    """``model``'s weights as megatron-core writes them: one global tensor per parameter, decoder
    layers stacked on a leading axis, transformer-engine's layer-norm names, vocabulary padded."""
    config = model.config
    shape = replace(LlamaShape.from_hf_config(config, 1), padded_vocab=pad_to)
    hf = model.state_dict()
    tensors, layers = {}, {}
    for name, rule in stage_rules(shape, 1, 0).items():
        tensor = rule.shard([hf[n] for n in rule.hf_names], 1, 0)
        if name.startswith("decoder.layers."):
            index, _, local = name[len("decoder.layers."):].partition(".")
            layers.setdefault(TE.get(local, local), {})[int(index)] = tensor
        else:
            tensors[name] = tensor
    for local, per_layer in layers.items():
        tensors[f"decoder.layers.{local}"] = torch.stack([per_layer[i] for i in range(config.num_hidden_layers)])
    save({prefix + k: v for k, v in tensors.items()}, storage_writer=FileSystemWriter(str(folder)), no_dist=True)


def test_a_megatron_checkpoint_gives_back_the_hf_weights(tmp_path):
    model = _qwen2()
    _megatron_checkpoint(model, tmp_path / "ckpt", prefix="module.")
    tensors = read_dist_checkpoint(tmp_path / "ckpt", prefix="module.")
    assert tensors["embedding.word_embeddings.weight"].shape[0] == 32  # padded; the padding is dropped below
    assert tensors["decoder.layers.self_attention.linear_qkv.layer_norm_weight"].shape[0] == 3  # stacked
    state = hf_state_from_megatron(tensors, model.config)
    own = model.state_dict()
    assert set(state) == set(own)  # untied head, q/k/v biases included
    assert all(torch.equal(state[name], own[name]) for name in own)


def test_loading_replaces_the_weights_in_place(tmp_path):
    source, target = _qwen2(), _qwen2()
    with torch.no_grad():
        for param in source.parameters():
            param.add_(1.0)
    _megatron_checkpoint(source, tmp_path / "ckpt")
    load_dist_checkpoint(target, tmp_path / "ckpt", target.config)
    assert all(torch.equal(a, b) for a, b in zip(source.state_dict().values(), target.state_dict().values()))


def test_a_wrong_folder_or_model_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a Megatron distributed checkpoint"):
        read_dist_checkpoint(tmp_path)
    model = _qwen2()
    _megatron_checkpoint(model, tmp_path / "ckpt")
    bigger = Qwen2Config(vocab_size=30, hidden_size=8, intermediate_size=16, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    with pytest.raises(ValueError, match="stacks 3 layers; the model has 4"):
        hf_state_from_megatron(read_dist_checkpoint(tmp_path / "ckpt"), bigger)

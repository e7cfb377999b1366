"""Shared helpers of the packing / sequence-parallel tests: rollout-shaped batches whose prompt and
response lengths vary from 1 to 20 tokens, tiny Llama and Qwen2 models, and actors/critics over them."""

from __future__ import annotations

import torch
from omegaconf import OmegaConf
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlvr.trainer.config.schema import RlvrConfig
from rlvr.utils.testing import tiny_causal_lm
from rlvr.workers.actor.dp_actor import DataParallelPPOActor
from rlvr.workers.critic.dp_critic import DataParallelPPOCritic
from rlvr.workers.fsdp import shard_module
from rlvr.workers.models import CriticModel
from rlvr.workers.packed_attention import use_packed_attention

VOCAB = 260


def random_batch(rows: int = 6, prompt_len: int = 20, response_len: int = 20, seed: int = 0) -> dict[str, torch.Tensor]:
    """A rollout-shaped batch: prompts of 1..``prompt_len`` tokens left-padded, responses of
    1..``response_len`` tokens right-padded (lengths drawn uniformly), token-level advantages."""
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(1, prompt_len + 1, (rows,), generator=gen)
    responses = torch.randint(1, response_len + 1, (rows,), generator=gen)
    prompts[0], responses[0] = 1, response_len  # the extremes always occur
    prompts[-1], responses[-1] = prompt_len, 1
    ids = torch.randint(4, VOCAB, (rows, prompt_len + response_len), generator=gen)
    mask = torch.zeros(rows, prompt_len + response_len, dtype=torch.long)
    for i in range(rows):
        mask[i, prompt_len - prompts[i] : prompt_len + responses[i]] = 1
    ids = ids * mask  # padding id 0
    response_mask = mask[:, prompt_len:]
    return {
        "input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        "responses": ids[:, prompt_len:], "response_mask": response_mask,
        "advantages": torch.randn(rows, response_len, generator=gen) * response_mask,
    }


def tiny_model(arch: str, seed: int = 0, num_key_value_heads: int = 2, checkpointing: bool = False):
    """A tiny random ``llama`` (4 heads) or ``qwen2`` (4 heads, q/k/v biases) causal LM in fp32."""
    if arch == "llama":
        model, _ = tiny_causal_lm(seed=seed, num_key_value_heads=num_key_value_heads)
    else:
        config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=num_key_value_heads, intermediate_size=64,
                             max_position_embeddings=512, tie_word_embeddings=True)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = Qwen2ForCausalLM(config).eval()
    if checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    return model


def actor_config(*overrides: str):
    """The actor section with small micro-batches and the given dotted overrides (relative to it)."""
    config = OmegaConf.structured(RlvrConfig)
    config = OmegaConf.merge(config, OmegaConf.from_dotlist(
        ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
         *[f"actor_rollout_ref.actor.{o}" for o in overrides]]))
    return config.actor_rollout_ref.actor


def make_actor(model, world_size: int = 1, packed: bool = False, sp_size: int = 1, lr: float = 0.0,
               mini_batch_size: int = 6, config=None, **kwargs) -> DataParallelPPOActor:
    """A trainable actor over ``model`` (switched to packed attention when ``packed``), sharded
    over ``world_size`` ranks, with plain SGD of ``lr``."""
    if packed:
        use_packed_attention(model)
    module = shard_module(model, world_size, "cpu", True)
    optimizer = torch.optim.SGD(module.parameters(), lr=lr)
    return DataParallelPPOActor(config if config is not None else actor_config(), module, optimizer,
                                mini_batch_size=mini_batch_size, log_prob_micro_batch_size=4, world_size=world_size,
                                device="cpu", use_remove_padding=packed, sp_size=sp_size, **kwargs)


def make_critic(arch: str, world_size: int = 1, packed: bool = False, sp_size: int = 1, lr: float = 0.0,
                mini_batch_size: int = 6, *overrides: str) -> DataParallelPPOCritic:
    """A critic (backbone of :func:`tiny_model` + value head, seeded alike) with plain SGD of ``lr``."""
    lm = tiny_model(arch)
    if packed:
        use_packed_attention(lm)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        module = CriticModel(lm.base_model, lm.config.hidden_size)
    module = shard_module(module, world_size, "cpu", True)
    config = OmegaConf.merge(OmegaConf.structured(RlvrConfig), OmegaConf.from_dotlist(
        ["critic.ppo_micro_batch_size_per_gpu=2", *[f"critic.{o}" for o in overrides]])).critic
    return DataParallelPPOCritic(config, module, torch.optim.SGD(module.parameters(), lr=lr),
                                 mini_batch_size=mini_batch_size, world_size=world_size, device="cpu",
                                 use_remove_padding=packed, sp_size=sp_size)

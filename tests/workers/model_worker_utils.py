"""Shared helpers of the model-worker tests: a run config for a tiny model, prompt batches and a
one-rank local worker group."""

from __future__ import annotations

import torch
from omegaconf import OmegaConf

from rlvr.protocol import DataProto
from rlvr.single_controller import ClassWithInitArgs, LocalResourcePool, LocalWorkerGroup
from rlvr.trainer.config.schema import RlvrConfig
from rlvr.utils.testing import tiny_tokenizer
from rlvr.utils.torch_functional import compute_position_ids

PROMPTS = ["1+1=", "hello there", "abc", "the cat sat on"]


def make_config(model_path: str, *overrides: str):
    """The whole run config for the tiny model at ``model_path`` with small batch sizes, plus
    dotted ``overrides`` (e.g. ``"actor_rollout_ref.actor.optim.lr=0.01"``)."""
    base = [
        f"actor_rollout_ref.model.path={model_path}",
        "actor_rollout_ref.rollout.response_length=6",
        "actor_rollout_ref.rollout.n=1",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=3",
        "critic.ppo_mini_batch_size=4",
        "critic.ppo_micro_batch_size_per_gpu=2",
        "trainer.seed=7",
        "trainer.num_threads=1",
        "trainer.call_timeout_s=300",
    ]
    config = OmegaConf.structured(RlvrConfig)
    return OmegaConf.merge(config, OmegaConf.from_dotlist(base + list(overrides)))


def prompt_batch(texts: list[str] = PROMPTS, **meta) -> DataProto:
    """Left-padded prompts ``input_ids/attention_mask/position_ids [B, P]`` of the tiny tokenizer."""
    tokenizer = tiny_tokenizer()
    enc = tokenizer(texts, return_tensors="pt", padding=True)
    mask = enc["attention_mask"]
    return DataProto.from_dict(
        tensors={"input_ids": enc["input_ids"], "attention_mask": mask, "position_ids": compute_position_ids(mask)},
        non_tensors={"uid": [str(i) for i in range(len(texts))]},
        meta_info=dict(meta),
    )


def with_advantages(rollout: DataProto, advantages: list[float], old_log_probs: torch.Tensor) -> DataProto:
    """A training batch: the rollout output plus per-sequence advantages and old log-probs."""
    mask = rollout.batch["response_mask"]
    adv = torch.tensor(advantages, dtype=torch.float32)[:, None] * mask
    tensors = {key: rollout.batch[key] for key in rollout.batch.keys()}
    tensors.update(advantages=adv, old_log_probs=old_log_probs)
    return DataProto.from_dict(tensors=tensors, meta_info={"temperature": 1.0})


def local_group(cls: type, *args) -> LocalWorkerGroup:
    """A one-rank local worker group of ``cls(*args)``, its model initialised."""
    group = LocalWorkerGroup(LocalResourcePool(), ClassWithInitArgs(cls, *args))
    group.init_model()
    return group

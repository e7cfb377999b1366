"""The embedded SmolLM2-135M-Instruct (9 query heads, 3 key/value heads) at tensor parallel 3 on the
local backend (3 processes, gloo): log-probs equal the Hugging Face forward's, and one PPO update
on the same batch equals the FSDP2 worker's (loss, gradient norm, weights after the step), fp32."""

from __future__ import annotations

import gc

import pytest
import torch
from omegaconf import OmegaConf

pytestmark = [pytest.mark.megatron, pytest.mark.slow]
pytest.importorskip("megatron.core")

from rlvr.protocol import DataProto  # noqa: E402
from rlvr.single_controller import ClassWithInitArgs, LocalResourcePool, LocalWorkerGroup  # noqa: E402
from rlvr.trainer.config.schema import RlvrConfig  # noqa: E402
from rlvr.utils.model import load_causal_lm, load_tokenizer  # noqa: E402
from rlvr.utils.torch_functional import compute_position_ids  # noqa: E402
from rlvr.workers.engine_workers import ActorRolloutRefWorker  # noqa: E402
from rlvr.workers.megatron.local_ranks import shutdown_local_ranks  # noqa: E402
from rlvr.workers.megatron.workers import MegatronActorRolloutRefWorker  # noqa: E402

MODEL = "smollm2-135m-instruct"
PROMPTS = ["What is 12 + 17?", "Name a prime number larger than ten.", "Say hello in French.", "2 + 2 ="]
ANSWERS = ["12 + 17 = 29", "Eleven is prime.", "Bonjour !", "4"]


def _config(*overrides: str):
    base = [f"actor_rollout_ref.model.path={MODEL}", "actor_rollout_ref.model.attn_implementation=eager",
            "actor_rollout_ref.rollout.n=1", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.actor.optim.lr=1e-5",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4", "trainer.num_threads=1",
            "trainer.call_timeout_s=900"]
    return OmegaConf.merge(OmegaConf.structured(RlvrConfig), OmegaConf.from_dotlist(base + list(overrides)))


def _batch() -> DataProto:
    """Chat prompts (left-padded) and teacher-forced answers (right-padded), with advantages."""
    tokenizer = load_tokenizer(MODEL)
    chats = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
             for p in PROMPTS]
    tokenizer.padding_side = "left"
    prompts = tokenizer(chats, return_tensors="pt", padding=True, add_special_tokens=False)
    tokenizer.padding_side = "right"
    answers = tokenizer(ANSWERS, return_tensors="pt", padding=True, add_special_tokens=False)
    ids = torch.cat([prompts["input_ids"], answers["input_ids"]], dim=1)
    mask = torch.cat([prompts["attention_mask"], answers["attention_mask"]], dim=1)
    response_mask = answers["attention_mask"]
    tensors = {"input_ids": ids, "attention_mask": mask, "position_ids": compute_position_ids(mask),
               "responses": answers["input_ids"], "response_mask": response_mask,
               "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None] * response_mask}
    return DataProto.from_dict(tensors=tensors, meta_info={"temperature": 1.0})


def _hf_log_probs(batch: DataProto) -> torch.Tensor:
    """The HF forward's fp32 logits, log-softmax in float64 (torch's fp32 log-softmax over 49k
    entries is itself off by up to ~3e-5)."""
    model = load_causal_lm(MODEL, dtype=torch.float32, attn_implementation="eager")
    b = batch.batch
    with torch.no_grad():
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                       position_ids=b["position_ids"]).logits
    responses = b["responses"]
    log_p = logits[:, -responses.shape[1] - 1 : -1].double().log_softmax(-1)
    return log_p.gather(-1, responses[..., None]).squeeze(-1).float()


def _group(cls, config):
    group = LocalWorkerGroup(LocalResourcePool(), ClassWithInitArgs(cls, config, "actor"))
    group.init_model()
    return group


def test_smollm2_at_tensor_parallel_3_matches_hf_and_fsdp():
    batch = _batch()
    mask = batch.batch["response_mask"].bool()
    reference = _hf_log_probs(batch)
    fsdp = _group(ActorRolloutRefWorker, _config())
    fsdp_lp = fsdp.compute_log_prob(batch).batch["old_log_probs"]
    batch.batch["old_log_probs"] = fsdp_lp - 0.02
    fsdp_metrics = fsdp.update_actor(batch).meta_info["metrics"]
    fsdp_weights = fsdp.get_actor_weights()[0]
    del fsdp
    gc.collect()
    try:
        mega = _group(MegatronActorRolloutRefWorker, _config("actor_rollout_ref.actor.strategy=megatron",
                                                             "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=3"))
        mega_lp = mega.compute_log_prob(batch).batch["old_log_probs"]
        vs_hf, vs_fsdp = float((mega_lp - reference)[mask].abs().max()), float((mega_lp - fsdp_lp)[mask].abs().max())
        metrics = mega.update_actor(batch).meta_info["metrics"]
        weights = mega.get_actor_weights()[0]
        weight_diff = max(float((weights[k] - fsdp_weights[k]).abs().max()) for k in fsdp_weights)
        print(f"\nSmolLM2 tp=3: log-probs vs HF {vs_hf:.2e}, vs FSDP2 {vs_fsdp:.2e}; pg_loss "
              f"{metrics['actor/pg_loss'][0]:.8f} vs {fsdp_metrics['actor/pg_loss'][0]:.8f}, grad_norm "
              f"{metrics['actor/grad_norm'][0]:.8f} vs {fsdp_metrics['actor/grad_norm'][0]:.8f}; weights {weight_diff:.2e}")
        assert vs_hf < 1e-5 and vs_fsdp < 1e-5
        for name in ("actor/pg_loss", "actor/ppo_kl", "actor/pg_clipfrac", "actor/grad_norm"):
            assert metrics[name] == [pytest.approx(fsdp_metrics[name][0], rel=1e-5, abs=1e-6)], name
        assert weights.keys() == fsdp_weights.keys() and weight_diff < 1e-5
    finally:
        gc.collect()
        shutdown_local_ranks()

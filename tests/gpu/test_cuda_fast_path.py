"""The GPU fast path on CUDA: static KV cache with a compiled decode step, exact rollout log-probs,
training with offload between phases. Each test needs a CUDA device (skipped elsewhere)."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from rlvr.single_controller import ClassWithInitArgs, LocalResourcePool, LocalWorkerGroup
from rlvr.trainer.config.schema import RolloutConfig
from rlvr.utils.testing import save_tiny_model, tiny_causal_lm
from rlvr.workers.engine_workers import ActorRolloutRefWorker
from rlvr.workers.rollout import HFRollout
from tests.workers.model_worker_utils import make_config, prompt_batch, with_advantages

pytestmark = pytest.mark.gpu


def _rollout(model, tokenizer, **overrides) -> HFRollout:
    config = OmegaConf.merge(OmegaConf.structured(RolloutConfig),
                             {"response_length": 24, "prompt_length": 32, "do_sample": False, **overrides})
    return HFRollout(config, model, tokenizer, "cuda", seed=1, owns_module=False)


def test_compiled_static_decode_gives_the_dynamic_cache_tokens_on_cuda():
    model, tokenizer = tiny_causal_lm(hidden_size=64, num_hidden_layers=2, seed=5)
    model = model.cuda()
    prompts = prompt_batch(["1+1=", "hello there, how are", "abc"], do_sample=False)
    plain = _rollout(model, tokenizer).generate_sequences(prompts)
    fast_engine = _rollout(model, tokenizer, static_cache=True, compile=True)
    for _ in range(2):  # the second call replays the captured graph on a reused cache
        fast = fast_engine.generate_sequences(prompts)
        assert torch.equal(fast.batch["responses"], plain.batch["responses"])
        assert torch.equal(fast.batch["response_mask"], plain.batch["response_mask"])
        torch.testing.assert_close(fast.batch["rollout_log_probs"], plain.batch["rollout_log_probs"],
                                   rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return str(save_tiny_model(tmp_path_factory.mktemp("gpu_model") / "model", hidden_size=64, seed=11))


def _group(model_dir: str, *overrides: str) -> LocalWorkerGroup:
    config = make_config(model_dir, "actor_rollout_ref.rollout.response_length=8",
                         "actor_rollout_ref.actor.optim.lr=0.01", *overrides)
    group = LocalWorkerGroup(LocalResourcePool(use_gpu=True), ClassWithInitArgs(ActorRolloutRefWorker, config,
                                                                                 "actor_rollout"))
    group.init_model()
    return group


def test_rollout_log_probs_equal_the_actors_on_cuda_in_fp32(tiny_model_dir):
    group = _group(tiny_model_dir, "actor_rollout_ref.actor.use_rollout_log_probs=false")
    out = group.generate_sequences(prompt_batch(temperature=1.0))
    recomputed = group.compute_log_prob(out)
    mask = out.batch["response_mask"].bool()
    diff = (recomputed.batch["old_log_probs"] - out.batch["rollout_log_probs"]).abs()[mask]
    assert diff.max().item() < 1e-4


def test_update_with_offload_keeps_weights_on_cpu_between_phases(tiny_model_dir):
    group = _group(tiny_model_dir, "actor_rollout_ref.actor.fsdp_config.param_offload=true",
                   "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true")
    worker = group._workers[0]
    before = {n: p.detach().to("cpu", copy=True) for n, p in worker.actor_module.named_parameters()}
    for _ in range(2):
        out = group.generate_sequences(prompt_batch(temperature=1.0))
        old = group.compute_log_prob(out).batch["old_log_probs"]
        reply = group.update_actor(with_advantages(out, [1.0, -1.0, 0.5, -0.5], old))
        assert all(torch.isfinite(torch.tensor(v)).all() for v in reply.meta_info["metrics"]["actor/pg_loss"])
        assert all(p.device.type == "cpu" for p in worker.actor_module.parameters())
        states = [s for group_state in worker.actor.optimizer.state.values() for s in group_state.values()
                  if torch.is_tensor(s) and s.dim() > 0]
        assert states and all(s.device.type == "cpu" for s in states)
    changed = sum(not torch.equal(before[n], p.detach().cpu()) for n, p in worker.actor_module.named_parameters())
    assert changed > 0

"""strategy=megatron on one GPU (tensor parallel 1, NCCL, megatron's own CUDA RNG tracker; no CPU
shim): log-probs and one PPO update equal the FSDP2 worker's on CUDA in float32. Needs CUDA and
megatron-core (`make setup-megatron`); skipped elsewhere."""

from __future__ import annotations

import gc

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.megatron]
pytest.importorskip("megatron.core")

from rlvr.single_controller import ClassWithInitArgs, LocalResourcePool, LocalWorkerGroup  # noqa: E402
from rlvr.utils.testing import save_tiny_model  # noqa: E402
from rlvr.workers.engine_workers import ActorRolloutRefWorker  # noqa: E402
from rlvr.workers.megatron.local_ranks import shutdown_local_ranks  # noqa: E402
from rlvr.workers.megatron.workers import MegatronActorRolloutRefWorker  # noqa: E402
from tests.workers.model_worker_utils import make_config, prompt_batch, with_advantages  # noqa: E402

COMMON = ("actor_rollout_ref.model.attn_implementation=eager", "actor_rollout_ref.actor.optim.lr=0.001",
          "trainer.device=cuda")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(save_tiny_model(tmp_path_factory.mktemp("gpu_megatron") / "model", hidden_size=64, seed=3))


def _group(cls, config):
    group = LocalWorkerGroup(LocalResourcePool(use_gpu=True), ClassWithInitArgs(cls, config, "actor_rollout"))
    group.init_model()
    return group


def test_megatron_tp1_matches_fsdp_on_cuda(model_dir):
    fsdp = _group(ActorRolloutRefWorker, make_config(model_dir, *COMMON))
    mega = _group(MegatronActorRolloutRefWorker, make_config(model_dir, *COMMON, "actor_rollout_ref.actor.strategy=megatron"))
    try:
        out = fsdp.generate_sequences(prompt_batch())
        out.meta_info.update(temperature=1.0, calculate_entropy=True)
        mask = out.batch["response_mask"].bool()
        one, two = fsdp.compute_log_prob(out).batch, mega.compute_log_prob(out).batch
        assert (one["old_log_probs"] - two["old_log_probs"])[mask].abs().max() < 1e-4
        assert (one["entropys"] - two["entropys"])[mask].abs().max() < 1e-4
        batch = with_advantages(out, [1.0, -0.5, 2.0, -1.0], one["old_log_probs"] - 0.05)
        a, b = fsdp.update_actor(batch).meta_info["metrics"], mega.update_actor(batch).meta_info["metrics"]
        assert b["actor/grad_norm"] == [pytest.approx(a["actor/grad_norm"][0], rel=1e-4)]
        w_one, w_two = fsdp.get_actor_weights()[0], mega.get_actor_weights()[0]
        assert max(float((w_one[k] - w_two[k]).abs().max()) for k in w_one) < 1e-4
        greedy = prompt_batch(validate=True)
        assert torch.equal(fsdp.generate_sequences(greedy).batch["responses"],
                           mega.generate_sequences(greedy).batch["responses"])
    finally:
        del mega
        gc.collect()
        shutdown_local_ranks()

"""The tiny Qwen2.5-VL with images on 2 Ray ranks (FSDP2 over gloo) against 1 local rank: the image
inputs are dispatched to the ranks with their rows, and log-probs, the update and the new weights
equal the unsharded run's."""

from __future__ import annotations

import pytest
import ray
import torch
from mm_helpers import image_batch, make_config

from rlvr.single_controller import (
    ClassWithInitArgs,
    LocalResourcePool,
    LocalWorkerGroup,
    RayResourcePool,
    RayWorkerGroup,
    init_ray,
)
from rlvr.utils.errors import WorkerError
from rlvr.utils.multimodal import MULTI_MODAL_INPUTS
from rlvr.workers.engine_workers import ActorRolloutRefWorker

pytestmark = pytest.mark.ray

# one mini-batch of all 8 rows: 2 ranks then train on the same rows per optimizer step as 1 rank
OVERRIDES = ("actor_rollout_ref.actor.optim.lr=0.001", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
             "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2")


@pytest.fixture(scope="module")
def two_ranks(vl_dirs):
    init_ray(num_cpus=2)
    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False)
    group = RayWorkerGroup(pool, ClassWithInitArgs(ActorRolloutRefWorker, make_config(vl_dirs["qwen2_5_vl"], *OVERRIDES),
                                                   "actor_rollout_ref"))
    group.init_model()
    yield group
    group.shutdown()
    pool.remove()
    ray.shutdown()


@pytest.mark.slow  # about 12-25 s: keeps the default suite under 10 minutes (it runs in CI's slow step)
def test_two_fsdp_ranks_with_images_match_one_rank(vl_dirs, image_data, two_ranks):
    model_dir = vl_dirs["qwen2_5_vl"]
    local = LocalWorkerGroup(LocalResourcePool(), ClassWithInitArgs(ActorRolloutRefWorker,
                                                                    make_config(model_dir, *OVERRIDES), "actor_rollout_ref"))
    local.init_model()
    out = two_ranks.generate_sequences(image_batch(model_dir, image_data, n=2))  # 4 rows per rank
    assert out.non_tensor_batch[MULTI_MODAL_INPUTS][5]["image_grid_thw"].tolist() == [[1, 4, 4]]  # prompt 2's image
    out.meta_info["temperature"] = 1.0
    mask = out.batch["response_mask"].bool()
    sharded = two_ranks.compute_log_prob(out).batch["old_log_probs"]
    assert (sharded - out.batch["rollout_log_probs"])[mask].abs().max() < 1e-5
    assert (local.compute_log_prob(out).batch["old_log_probs"] - sharded)[mask].abs().max() < 1e-5

    out.batch["old_log_probs"] = sharded - 0.05
    out.batch["advantages"] = torch.tensor([1.0, -0.5, 2.0, -1.0, 0.5, 1.0, -2.0, 0.0])[:, None] * out.batch["response_mask"]
    one = local.update_actor(out).meta_info["metrics"]
    two = two_ranks.update_actor(out).meta_info["metrics"]
    for name in ("actor/pg_loss", "actor/ppo_kl", "actor/grad_norm"):
        assert two[name] == [pytest.approx(v, rel=1e-5, abs=1e-7) for v in one[name] for _ in range(2)], name
    w_one, w_two = local.get_actor_weights()[0], two_ranks.get_actor_weights()[0]
    # Adam's first step moves every weight by about lr (1e-3): 2 ranks accumulate the gradients in another order
    assert max((w_one[k] - w_two[k]).abs().max().item() for k in w_one) < 1e-5
    assert any(k.startswith("model.visual") for k in w_one)  # the vision encoder was trained and gathered too


@pytest.mark.slow
def test_a_row_without_an_image_is_refused_on_sharded_ranks(vl_dirs, image_data, two_ranks):
    out = two_ranks.generate_sequences(image_batch(vl_dirs["qwen2_5_vl"], image_data, n=1))
    out.meta_info["temperature"] = 1.0
    out.non_tensor_batch[MULTI_MODAL_INPUTS] = out.non_tensor_batch[MULTI_MODAL_INPUTS].copy()
    out.non_tensor_batch[MULTI_MODAL_INPUTS][3] = {}  # rank 1 refuses before any forward (rank 0 then waits)
    with pytest.raises(WorkerError, match=r"rank 1 raised and rank\(s\) \[0\] gave no result") as caught:
        two_ranks.compute_log_prob(out, _timeout_s=10)  # rank 0 waits for rank 1 in a collective until then
    assert "compute_log_prob: 1 row(s) of this rank's batch have no image" in str(caught.value.__cause__)

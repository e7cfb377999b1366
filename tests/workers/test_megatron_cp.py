"""Megatron context parallelism (rlvr.workers.megatron.context_parallel) equals the unsplit model:
the same workers on the local backend with context_parallel_size 2 and 1 (alone and with tensor
parallelism 2; gloo, float32) give the same log-probs, entropies, reference log-probs, values, update
losses and gradient norms and weights after the step (1e-5); and, on spawned ranks, the same
parameter gradients (1e-5)."""

from __future__ import annotations

import gc
import socket

import pytest
import torch
import torch.multiprocessing as mp
from model_worker_utils import local_group, make_config, prompt_batch

pytestmark = pytest.mark.megatron
pytest.importorskip("megatron.core")

from megatron_cp_ranks import run_rank  # noqa: E402 - imports megatron-core

from test_megatron_workers import COMMON, UPDATE_METRICS, max_diff, megatron_config, training_batch  # noqa: E402

from rlvr.protocol import DataProto  # noqa: E402
from rlvr.workers.engine_workers import ActorRolloutRefWorker  # noqa: E402
from rlvr.workers.megatron.context_parallel import ContextParallel  # noqa: E402
from rlvr.workers.megatron.local_ranks import shutdown_local_ranks  # noqa: E402
from rlvr.workers.megatron.workers import MegatronActorRolloutRefWorker, MegatronCriticWorker  # noqa: E402

TOL = 1e-5


def test_positions_split_the_sequence_into_balanced_chunks():
    cp = ContextParallel(size=2, rank=0, group=None)
    assert cp.padded_length(9) == 12 and cp.padded_length(8) == 8
    assert cp.positions(8).tolist() == [0, 1, 6, 7]  # chunks 0 and 3 of 4
    assert cp.positions(8, rank=1).tolist() == [2, 3, 4, 5]  # chunks 1 and 2
    held = torch.cat([cp.positions(8, r) for r in range(2)])
    assert held[cp.gather_order(8)].tolist() == list(range(8))


def _run(model_dir: str, tp: int, cp: int, rollout: DataProto) -> dict:
    """Log-probs, reference, values, one actor and one critic update with the given layout."""
    extra = (f"actor_rollout_ref.actor.megatron.context_parallel_size={cp}",)
    actor = local_group(MegatronActorRolloutRefWorker, megatron_config(model_dir, tp, 1, *extra), "actor_rollout_ref")
    critic = local_group(MegatronCriticWorker, megatron_config(model_dir, tp, 1, *extra))
    out = DataProto.from_dict(tensors={key: value.clone() for key, value in rollout.batch.items()},
                              meta_info={"temperature": 1.0, "calculate_entropy": True})
    result = {"log_prob": actor.compute_log_prob(out).batch, "ref": actor.compute_ref_log_prob(out).batch["ref_log_prob"],
              "values": critic.compute_values(out).batch["values"]}
    batch = training_batch(out, result["log_prob"]["old_log_probs"], result["ref"])
    result["update"] = actor.update_actor(batch).meta_info["metrics"]
    result["weights"] = actor.get_actor_weights()[0]
    returns = torch.tensor([1.0, -1.0, 0.5, 2.0])[:, None] * out.batch["response_mask"]
    batch.batch["values"], batch.batch["returns"] = result["values"], returns
    result["critic"] = critic.update_critic(batch).meta_info["metrics"]
    result["values_after"] = critic.compute_values(out).batch["values"]
    del actor, critic
    gc.collect()
    shutdown_local_ranks()  # the next layout starts its own ranks
    return result


@pytest.mark.parametrize("tp", [1, 2])
def test_context_parallel_workers_equal_one_context_rank(model_dir, tp):
    rollout = local_group(ActorRolloutRefWorker, make_config(model_dir, *COMMON), "rollout").generate_sequences(prompt_batch())
    mask = rollout.batch["response_mask"].bool()
    one, two = _run(model_dir, tp, 1, rollout), _run(model_dir, tp, 2, rollout)
    gaps = {key: max_diff(one["log_prob"][key], two["log_prob"][key], mask) for key in ("old_log_probs", "entropys")}
    gaps.update(ref=max_diff(one["ref"], two["ref"], mask), values=max_diff(one["values"], two["values"], mask),
                values_after=max_diff(one["values_after"], two["values_after"], mask),
                weights=max(float((one["weights"][k] - two["weights"][k]).abs().max()) for k in one["weights"]))
    print(f"\ntp={tp}: cp=2 against cp=1: " + ", ".join(f"{k} {v:.1e}" for k, v in gaps.items()))
    assert max(gaps.values()) < TOL, gaps
    for name in UPDATE_METRICS:
        assert two["update"][name] == [pytest.approx(one["update"][name][0], rel=TOL, abs=1e-6)], name
    for name in ("critic/vf_loss", "critic/vf_clipfrac", "critic/grad_norm"):
        assert two["critic"][name] == [pytest.approx(one["critic"][name][0], rel=TOL, abs=1e-6)], name


def _spawn(tp: int, cp: int, model_dir: str, out) -> list[dict]:
    out.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    world = tp * cp
    mp.start_processes(run_rank, args=(world, tp, cp, port, model_dir, str(out)), nprocs=world, start_method="spawn")
    return [torch.load(out / f"rank{rank}.pt") for rank in range(world)]


@pytest.mark.parametrize("tp", [1, 2])
def test_context_parallel_gradients_equal_one_context_rank(model_dir, tp, tmp_path):
    """Every context rank ends with the whole batch's gradients of its tensor-parallel shard."""
    reference = {r["tp_rank"]: r for r in _spawn(tp, 1, model_dir, tmp_path / "cp1")}
    split = _spawn(tp, 2, model_dir, tmp_path / "cp2")
    assert sorted((r["tp_rank"], r["cp_rank"]) for r in split) == [(t, c) for t in range(tp) for c in range(2)]
    worst = {"log_probs": 0.0, "entropy": 0.0, "grads": 0.0}
    for result in split:
        one = reference[result["tp_rank"]]
        for key in ("log_probs", "entropy"):
            worst[key] = max(worst[key], float((result[key] - one[key]).abs().max()))
        assert result["loss"] == pytest.approx(one["loss"], rel=TOL, abs=TOL)
        assert result["norm"] == pytest.approx(one["norm"], rel=TOL)
        assert result["grads"].keys() == one["grads"].keys()
        for name, grad in one["grads"].items():
            assert grad.abs().max() > 0, name  # every parameter gets a gradient (the check can fail)
            worst["grads"] = max(worst["grads"], float((result["grads"][name] - grad).abs().max()))
    print(f"\ntp={tp}: cp=2 against cp=1 (spawned ranks): " + ", ".join(f"{k} {v:.1e}" for k, v in worst.items()))
    assert max(worst.values()) < TOL, worst

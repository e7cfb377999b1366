"""Megatron workers on the local backend (the driver's worker starts the other model-parallel ranks
over gloo) against the FSDP2 workers on the same batch: log-probs, entropy, reference, the PPO
update (loss, gradient norm, weights after the step), values, weight sync, checkpoints, export.

Both backends run HF's eager attention here (``attn_implementation=eager``): megatron-core's local
attention is the same arithmetic, so differences are float32 rounding of other summation orders.
"""

from __future__ import annotations

import gc
import sys
from types import ModuleType

import pytest
import torch
from model_worker_utils import local_group, make_config, prompt_batch, with_advantages
from transformers import AutoModelForCausalLM

pytestmark = pytest.mark.megatron
pytest.importorskip("megatron.core")

from rlvr.protocol import DataProto  # noqa: E402
from rlvr.utils.errors import WorkerError  # noqa: E402
from rlvr.workers.engine_workers import ActorRolloutRefWorker, CriticWorker  # noqa: E402
from rlvr.workers.megatron.local_ranks import shutdown_local_ranks  # noqa: E402
from rlvr.workers.megatron.workers import MegatronActorRolloutRefWorker, MegatronCriticWorker  # noqa: E402

COMMON = ("actor_rollout_ref.model.attn_implementation=eager", "actor_rollout_ref.actor.optim.lr=0.001",
          "critic.optim.lr=0.01", "actor_rollout_ref.actor.use_kl_loss=true",
          "actor_rollout_ref.actor.kl_loss_coef=0.1", "actor_rollout_ref.actor.entropy_coeff=0.01")
UPDATE_METRICS = ("actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/entropy", "actor/kl_loss",
                  "actor/grad_norm")


@pytest.fixture(autouse=True)
def fresh_ranks():
    """Every test starts its own model-parallel ranks (the layout is global to a process)."""
    yield
    gc.collect()
    shutdown_local_ranks()


def megatron_config(model_dir: str, tp: int, pp: int, *extra: str):
    return make_config(model_dir, *COMMON, "actor_rollout_ref.actor.strategy=megatron", "critic.strategy=megatron",
                       f"actor_rollout_ref.actor.megatron.tensor_model_parallel_size={tp}",
                       f"actor_rollout_ref.actor.megatron.pipeline_model_parallel_size={pp}", *extra)


def max_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    return float((a - b)[mask].abs().max())


def weights_diff(one: dict, two: dict) -> float:
    assert one.keys() == two.keys()
    return max(float((one[k] - two[k]).abs().max()) for k in one)


def scored_rollout(fsdp) -> tuple[DataProto, torch.Tensor]:
    """A sampled rollout of the FSDP worker, asking for log-probs, entropy and sum of squared probabilities."""
    out = fsdp.generate_sequences(prompt_batch())
    out.meta_info.update(temperature=1.0, calculate_entropy=True, calculate_sum_pi_squared=True)
    return out, out.batch["response_mask"].bool()


def training_batch(out: DataProto, old: torch.Tensor, ref: torch.Tensor) -> DataProto:
    out.batch["response_mask"][0, 3:] = 0  # rows with different token counts
    batch = with_advantages(out, [1.0, -0.5, 2.0, -1.0], old - 0.05)
    batch.batch["ref_log_prob"] = ref
    return batch


def assert_same_update(one: dict, two: dict) -> None:
    for name in UPDATE_METRICS:
        assert two[name] == [pytest.approx(one[name][0], rel=1e-5, abs=1e-6)], name


@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2)])
def test_megatron_actor_matches_fsdp(model_dir, tp, pp, tmp_path):
    fsdp = local_group(ActorRolloutRefWorker, make_config(model_dir, *COMMON), "actor_rollout_ref")
    mega = local_group(MegatronActorRolloutRefWorker, megatron_config(model_dir, tp, pp), "actor_rollout_ref")
    out, mask = scored_rollout(fsdp)
    one, two = fsdp.compute_log_prob(out).batch, mega.compute_log_prob(out).batch
    assert max_diff(one["old_log_probs"], two["old_log_probs"], mask) < 1e-5
    assert max_diff(one["entropys"], two["entropys"], mask) < 1e-5
    assert max_diff(one["sum_pi_squared"], two["sum_pi_squared"], mask) < 1e-5  # reduced over the vocabulary slices
    ref = mega.compute_ref_log_prob(out).batch["ref_log_prob"]
    assert max_diff(ref, fsdp.compute_ref_log_prob(out).batch["ref_log_prob"], mask) < 1e-5

    # one PPO update (policy loss + entropy bonus + KL loss) on the same batch
    batch = training_batch(out, one["old_log_probs"], ref)
    fsdp_metrics, mega_metrics = fsdp.update_actor(batch).meta_info["metrics"], mega.update_actor(batch).meta_info["metrics"]
    after = mega.get_actor_weights()[0]
    print(f"\ntp={tp} pp={pp} against FSDP2: log-probs {max_diff(one['old_log_probs'], two['old_log_probs'], mask):.1e}, "
          f"entropy {max_diff(one['entropys'], two['entropys'], mask):.1e}, reference "
          f"{max_diff(ref, fsdp.compute_ref_log_prob(out).batch['ref_log_prob'], mask):.1e}, loss rel. "
          f"{abs(mega_metrics['actor/pg_loss'][0] / fsdp_metrics['actor/pg_loss'][0] - 1):.1e}, grad norm rel. "
          f"{abs(mega_metrics['actor/grad_norm'][0] / fsdp_metrics['actor/grad_norm'][0] - 1):.1e}, weights "
          f"{weights_diff(fsdp.get_actor_weights()[0], after):.1e}")
    assert_same_update(fsdp_metrics, mega_metrics)
    assert weights_diff(fsdp.get_actor_weights()[0], after) < 1e-5

    # the rollout's replica follows the gathered shards: same greedy text, sampling log-probs agree
    greedy = prompt_batch(validate=True)
    assert torch.equal(fsdp.generate_sequences(greedy).batch["responses"], mega.generate_sequences(greedy).batch["responses"])
    assert_rollout_follows_the_actor(mega)

    # the export is a plain Hugging Face folder with the gathered weights
    assert_export_is(mega, after, tmp_path / "hf")


def assert_rollout_follows_the_actor(mega) -> None:
    """The rollout replica's sampling log-probs equal the actor's recomputed ones (fp32, 1e-5)."""
    fresh = mega.generate_sequences(prompt_batch())
    fresh.meta_info["temperature"] = 1.0
    rescored = mega.compute_log_prob(fresh).batch["old_log_probs"]
    assert max_diff(rescored, fresh.batch["rollout_log_probs"], fresh.batch["response_mask"].bool()) < 1e-5


def assert_export_is(mega, weights: dict, folder) -> None:
    """``export_hf`` into ``folder`` gives a Hugging Face model with exactly ``weights``."""
    mega.export_hf(str(folder))
    exported = AutoModelForCausalLM.from_pretrained(folder).state_dict()
    assert all(torch.equal(exported[k], weights[k]) for k in weights)


def test_megatron_checkpoint_resumes_exactly(model_dir, tmp_path):
    mega = local_group(MegatronActorRolloutRefWorker, megatron_config(model_dir, 2, 1), "actor_rollout_ref")
    out = mega.generate_sequences(prompt_batch())
    out.meta_info["temperature"] = 1.0
    old = mega.compute_log_prob(out).batch["old_log_probs"]
    batch = training_batch(out, old, old)
    mega.update_actor(batch)
    mega.save_checkpoint(str(tmp_path / "ckpt"))
    saved = mega.get_actor_weights()[0]
    first = mega.update_actor(batch).meta_info["metrics"]
    moved = mega.get_actor_weights()[0]
    mega.load_checkpoint(str(tmp_path / "ckpt"))
    assert all(torch.equal(mega.get_actor_weights()[0][k], saved[k]) for k in saved)
    assert mega.update_actor(batch).meta_info["metrics"] == first  # optimizer and LR schedule restored too
    assert all(torch.equal(mega.get_actor_weights()[0][k], moved[k]) for k in moved)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["huggingface", "megatron_tp0_pp0.pt",
                                                                       "megatron_tp1_pp0.pt"]

    # another layout is refused with the sizes the checkpoint was written with
    del mega
    gc.collect()
    shutdown_local_ranks()
    other = local_group(MegatronActorRolloutRefWorker, megatron_config(model_dir, 1, 1), "actor_rollout_ref")
    with pytest.raises(WorkerError, match="tensor_model_parallel_size': 2.*this run has tensor_model_parallel_size=1"):
        other.load_checkpoint(str(tmp_path / "ckpt"))


def test_megatron_critic_matches_fsdp(model_dir):
    config = make_config(model_dir, *COMMON)
    rollout = local_group(ActorRolloutRefWorker, config, "rollout")
    out = rollout.generate_sequences(prompt_batch())
    mask = out.batch["response_mask"].bool()
    fsdp = local_group(CriticWorker, config)
    mega = local_group(MegatronCriticWorker, megatron_config(model_dir, 2, 1))
    values = fsdp.compute_values(out).batch["values"]
    assert max_diff(mega.compute_values(out).batch["values"], values, mask) < 1e-5
    returns = torch.tensor([1.0, -1.0, 0.5, 2.0])[:, None] * out.batch["response_mask"]
    batch = DataProto.from_dict(tensors={**{k: out.batch[k] for k in out.batch.keys()}, "values": values,
                                         "returns": returns})
    one, two = fsdp.update_critic(batch).meta_info["metrics"], mega.update_critic(batch).meta_info["metrics"]
    for name in ("critic/vf_loss", "critic/vf_clipfrac", "critic/grad_norm"):
        assert two[name] == [pytest.approx(one[name][0], rel=1e-5, abs=1e-6)], name
    assert max_diff(mega.compute_values(out).batch["values"], fsdp.compute_values(out).batch["values"], mask) < 1e-5


def test_a_failing_rank_is_named_and_stops_the_ranks(model_dir):
    mega = local_group(MegatronActorRolloutRefWorker, megatron_config(model_dir, 2, 1), "actor_rollout_ref")
    with pytest.raises(WorkerError, match="'megatron local ranks', method 'load_checkpoint', rank 1 failed"):
        mega.load_checkpoint("/no/such/folder")  # every rank raises; rank 1's traceback comes with rank 0's
    with pytest.raises(WorkerError, match="the local model-parallel ranks were stopped"):
        mega.compute_log_prob(prompt_batch())


class _RecordingLLM:
    """Stands in for ``vllm.LLM`` in the vLLM engine: keeps the weights of every in-place reload."""

    def __init__(self, **kwargs) -> None:
        self.loads: list[dict[str, torch.Tensor]] = []

    def collective_rpc(self, method: str, kwargs: dict) -> None:
        assert method == "reload_weights" and kwargs["is_checkpoint_format"]
        self.loads.append({name: tensor.clone() for name, tensor in kwargs["weights_iterator"]})

    def reset_prefix_cache(self) -> None:
        return None


def test_the_vllm_engine_gets_the_gathered_hf_weights(model_dir, monkeypatch):
    """With ``rollout.name=vllm`` (vLLM's ``LLM`` faked) the engine starts from the HF weights and
    every sync loads the gathered shards under HF names, tied head included."""
    fake = ModuleType("vllm")
    fake.LLM, fake.SamplingParams = _RecordingLLM, object
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    mega = local_group(MegatronActorRolloutRefWorker, megatron_config(model_dir, 2, 1, "actor_rollout_ref.rollout.name=vllm"),
                       "actor_rollout")
    llm = mega._workers[0].rollout.llm
    initial = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    assert llm.loads[0].keys() == initial.keys() and all(torch.equal(llm.loads[0][k], initial[k]) for k in initial)
    out = local_group(ActorRolloutRefWorker, make_config(model_dir, *COMMON), "rollout").generate_sequences(prompt_batch())
    out.meta_info["temperature"] = 1.0
    old = mega.compute_log_prob(out).batch["old_log_probs"]
    mega.update_actor(training_batch(out, old, old))
    mega.update_weights()
    after = mega.get_actor_weights()[0]
    assert llm.loads[-1].keys() == after.keys() and all(torch.equal(llm.loads[-1][k], after[k]) for k in after)
    assert not torch.equal(after["model.norm.weight"], initial["model.norm.weight"])

"""Role workers on one rank through the local backend (tiny random Llama, CPU, fp32)."""

from __future__ import annotations

import pytest
import torch
from model_worker_utils import local_group, make_config, prompt_batch, with_advantages
from transformers import AutoModelForCausalLM

from rlvr.protocol import DataProto
from rlvr.utils.errors import ConfigError, WorkerError
from rlvr.utils.testing import save_tiny_model, tiny_tokenizer
from rlvr.workers.engine_workers import ActorRolloutRefWorker, CriticWorker
from rlvr.workers.models import critic_tokenizer
from rlvr.workers.rollout.static_decode import DynamicCacheDecoder


@pytest.fixture(scope="module")
def other_model_dir(tmp_path_factory) -> str:
    return str(save_tiny_model(tmp_path_factory.mktemp("tiny_other") / "model", seed=1))


def hybrid(model_dir: str, *overrides: str):
    return local_group(ActorRolloutRefWorker, make_config(model_dir, *overrides), "actor_rollout_ref")


def seq_log_prob(log_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (log_probs * mask).sum(-1)


def test_rollout_log_probs_equal_actor_log_probs(model_dir):
    group = hybrid(model_dir, "actor_rollout_ref.actor.use_rollout_log_probs=false",
                   "actor_rollout_ref.rollout.temperature=0.7", "actor_rollout_ref.rollout.top_k=20",
                   "actor_rollout_ref.rollout.top_p=0.9")
    out = group.generate_sequences(prompt_batch())
    assert out.batch["responses"].shape == (4, 6)
    assert out.batch["input_ids"].shape == (4, out.batch["prompts"].shape[1] + 6)
    out.meta_info["temperature"] = 0.7
    computed = group.compute_log_prob(out)
    assert computed.meta_info["metrics"]["actor/reused_rollout_log_probs"] == [0.0]
    mask = out.batch["response_mask"].bool()
    diff = (computed.batch["old_log_probs"] - out.batch["rollout_log_probs"])[mask].abs().max()
    assert diff < 1e-5


def test_compute_log_prob_reuses_exact_rollout_log_probs_until_the_weights_change(model_dir):
    group = hybrid(model_dir, "actor_rollout_ref.actor.optim.lr=0.01")
    out = group.generate_sequences(prompt_batch())
    reused = group.compute_log_prob(out)
    assert reused.meta_info["metrics"]["actor/reused_rollout_log_probs"] == [1.0]
    assert torch.equal(reused.batch["old_log_probs"], out.batch["rollout_log_probs"])
    group.update_actor(with_advantages(out, [1.0, -1.0, 1.0, -1.0], reused.batch["old_log_probs"]))
    stale = group.compute_log_prob(out)  # generated before the update: must be recomputed
    assert stale.meta_info["metrics"]["actor/reused_rollout_log_probs"] == [0.0]


def test_update_weights_makes_the_rollout_generate_from_the_new_weights(model_dir, other_model_dir):
    greedy = {"validate": True}
    rollout = local_group(ActorRolloutRefWorker, make_config(model_dir), "rollout")
    fresh = local_group(ActorRolloutRefWorker, make_config(other_model_dir), "rollout")
    before = rollout.generate_sequences(prompt_batch(**greedy)).batch["responses"]
    rollout.update_weights(AutoModelForCausalLM.from_pretrained(other_model_dir).state_dict())  # tied lm_head too
    after = rollout.generate_sequences(prompt_batch(**greedy)).batch["responses"]
    expected = fresh.generate_sequences(prompt_batch(**greedy)).batch["responses"]
    assert not torch.equal(before, after)
    assert torch.equal(after, expected)


def test_actor_update_raises_positive_and_lowers_negative_advantage_responses(model_dir):
    group = hybrid(model_dir, "actor_rollout_ref.actor.optim.lr=0.005", "actor_rollout_ref.actor.ppo_epochs=2")
    out = group.generate_sequences(prompt_batch())
    old = group.compute_log_prob(out).batch["old_log_probs"]
    advantages = [1.0, -1.0, 1.0, -1.0]
    result = group.update_actor(with_advantages(out, advantages, old))
    metrics = result.meta_info["metrics"]
    assert len(metrics["actor/pg_loss"]) == 2  # 2 epochs x 1 mini-batch
    mask = out.batch["response_mask"].float()
    token_mean_adv = float((torch.tensor(advantages)[:, None] * mask).sum() / mask.sum())
    assert metrics["actor/pg_loss"][0] == pytest.approx(-token_mean_adv, abs=1e-6)  # ratio 1: loss = -mean(A)
    assert metrics["actor/pg_clipfrac"][0] == 0.0 and metrics["actor/ppo_kl"][0] == pytest.approx(0.0, abs=1e-6)
    assert metrics["actor/skipped_steps"] == [0.0, 0.0] and metrics["actor/lr"] == [0.005]
    new = group.compute_log_prob(out).batch["old_log_probs"]
    mask = out.batch["response_mask"]
    change = seq_log_prob(new, mask) - seq_log_prob(old, mask)
    assert (change[[0, 2]] > 0).all() and (change[[1, 3]] < 0).all(), change


def test_kl_loss_and_entropy_metrics_are_the_hand_computed_values(model_dir):
    group = hybrid(model_dir, "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=1.0",
                   "actor_rollout_ref.actor.kl_loss_type=low_var_kl", "actor_rollout_ref.actor.entropy_coeff=0.01")
    out = group.generate_sequences(prompt_batch())
    out.meta_info["calculate_entropy"] = True
    scored = group.compute_log_prob(out)
    assert scored.meta_info["metrics"]["actor/reused_rollout_log_probs"] == [0.0]  # entropy needs the forward
    old, entropys = scored.batch["old_log_probs"], scored.batch["entropys"]
    mask = out.batch["response_mask"].float()
    assert ((entropys > 0) & (entropys <= torch.log(torch.tensor(260.0)) + 1e-5)).all()
    batch = with_advantages(out, [0.0, 0.0, 0.0, 0.0], old)
    batch.batch["ref_log_prob"] = old - 0.1  # log-ratio 0.1 on every token
    metrics = group.update_actor(batch).meta_info["metrics"]
    k3 = torch.exp(torch.tensor(-0.1)).item() + 0.1 - 1.0
    assert metrics["actor/kl_loss"][0] == pytest.approx(k3, rel=1e-4)
    assert metrics["actor/entropy"][0] == pytest.approx(float((entropys * mask).sum() / mask.sum()), rel=1e-5)


def _grad_norm_and_weights(model_dir, out, old, *overrides):
    group = hybrid(model_dir, "actor_rollout_ref.actor.optim.lr=0.001", *overrides)
    metrics = group.update_actor(with_advantages(out, [1.0, -0.5, 2.0, -1.0], old)).meta_info["metrics"]
    return metrics, group.get_actor_weights()[0]


def test_micro_batches_and_token_budget_give_the_same_update_as_one_batch(model_dir):
    group = hybrid(model_dir)
    out = group.generate_sequences(prompt_batch())
    out.batch["response_mask"][:, 4:] = 0  # unequal response lengths: token shares differ per micro-batch
    out.batch["response_mask"][0, 2:] = 0
    old = group.compute_log_prob(out).batch["old_log_probs"] - 0.1  # ratio != 1: clipping and non-zero loss
    one, w_one = _grad_norm_and_weights(model_dir, out, old, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4")
    micro, w_micro = _grad_norm_and_weights(model_dir, out, old,
                                            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1")
    budget, w_budget = _grad_norm_and_weights(model_dir, out, old, "actor_rollout_ref.actor.use_dynamic_bsz=true",
                                              "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=30")
    for other in (micro, budget):
        assert other["actor/pg_loss"][0] == pytest.approx(one["actor/pg_loss"][0], rel=1e-5)
        assert other["actor/grad_norm"][0] == pytest.approx(one["actor/grad_norm"][0], rel=1e-5)
    for weights in (w_micro, w_budget):
        assert all(torch.allclose(weights[k], w_one[k], atol=1e-6) for k in w_one)


def test_non_finite_gradient_skips_the_step(model_dir):
    group = hybrid(model_dir)
    out = group.generate_sequences(prompt_batch())
    old = group.compute_log_prob(out).batch["old_log_probs"]
    before = group.get_actor_weights()[0]
    batch = with_advantages(out, [1.0, -1.0, 1.0, -1.0], old)
    batch.batch["advantages"][0, 0] = float("nan")
    metrics = group.update_actor(batch).meta_info["metrics"]
    assert metrics["actor/skipped_steps"] == [1.0]
    after = group.get_actor_weights()[0]
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_lora_reference_equals_the_base_model(model_dir):
    group = hybrid(model_dir, "actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.actor.optim.lr=0.05")
    ref = local_group(ActorRolloutRefWorker, make_config(model_dir), "ref")
    out = group.generate_sequences(prompt_batch())
    old = group.compute_log_prob(out).batch["old_log_probs"]
    group.update_actor(with_advantages(out, [1.0, -1.0, 1.0, -1.0], old))
    mask = out.batch["response_mask"].bool()
    lora_ref = group.compute_ref_log_prob(out).batch["ref_log_prob"]
    base = ref.compute_ref_log_prob(out).batch["ref_log_prob"]
    actor = group.compute_log_prob(out).batch["old_log_probs"]
    assert (lora_ref - base)[mask].abs().max() < 1e-5
    assert (actor - base)[mask].abs().max() > 1e-3  # the adapters did train


def test_critic_values_move_toward_the_returns(model_dir):
    critic = local_group(CriticWorker, make_config(model_dir, "critic.optim.lr=0.01"))
    rollout = hybrid(model_dir)
    out = rollout.generate_sequences(prompt_batch())
    mask = out.batch["response_mask"].float()
    returns = torch.tensor([1.0, -1.0, 0.5, 2.0])[:, None] * mask
    errors, clipfracs = [], []
    for _ in range(4):
        values = critic.compute_values(out).batch["values"]
        errors.append(float((((values - returns) ** 2) * mask).sum() / mask.sum()))
        batch = DataProto.from_dict(tensors={**{k: out.batch[k] for k in out.batch.keys()}, "values": values,
                                             "returns": returns})
        metrics = critic.update_critic(batch).meta_info["metrics"]
        clipfracs.append(metrics["critic/vf_clipfrac"][0])
        assert metrics["critic/vf_loss"][0] == pytest.approx(0.5 * errors[-1], rel=1e-4)  # unclipped at the centre
    assert errors[-1] < 0.5 * errors[0], errors


def test_the_critic_tokenizer_is_the_policys_unless_set_and_must_share_its_vocabulary(model_dir, tmp_path):
    assert critic_tokenizer(make_config(model_dir)).get_vocab() == tiny_tokenizer().get_vocab()
    copy, other = tiny_tokenizer(), tiny_tokenizer()
    copy.save_pretrained(tmp_path / "copy")
    other.add_tokens(["<extra>"])
    other.save_pretrained(tmp_path / "other")
    assert critic_tokenizer(make_config(model_dir, f"critic.model.tokenizer_path={tmp_path / 'copy'}")) is not None
    with pytest.raises(WorkerError, match="has another vocabulary than the policy's") as info:
        local_group(CriticWorker, make_config(model_dir, f"critic.model.tokenizer_path={tmp_path / 'other'}"))
    assert isinstance(info.value.__cause__, ConfigError) and info.value.__cause__.key == "critic.model.tokenizer_path"


def test_checkpoint_round_trip_and_hf_export(model_dir, tmp_path):
    overrides = ("actor_rollout_ref.actor.optim.lr=0.01", "actor_rollout_ref.actor.optim.warmup_steps=3")
    group = hybrid(model_dir, *overrides)
    out = group.generate_sequences(prompt_batch())
    old = group.compute_log_prob(out).batch["old_log_probs"]
    batch = with_advantages(out, [1.0, -1.0, 1.0, -1.0], old)
    group.update_actor(batch)
    group.save_checkpoint(str(tmp_path / "ckpt"))
    group.export_hf(str(tmp_path / "hf"))
    restored = hybrid(model_dir, *overrides)
    restored.load_checkpoint(str(tmp_path / "ckpt"))
    # optimizer moments and the schedule come back: the next update is identical
    first = group.update_actor(batch).meta_info["metrics"]
    second = restored.update_actor(batch).meta_info["metrics"]
    assert first["actor/lr"] == second["actor/lr"] == [pytest.approx(0.01 * 2 / 3)]
    w1, w2 = group.get_actor_weights()[0], restored.get_actor_weights()[0]
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert (tmp_path / "hf" / "tokenizer.json").is_file()
    saved = torch.load(tmp_path / "ckpt" / "model.pt")
    assert all(torch.equal(exported.state_dict()[k], saved[k]) for k in saved)


def test_lora_export_merges_the_adapters(model_dir, tmp_path):
    group = hybrid(model_dir, "actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.actor.optim.lr=0.05")
    out = group.generate_sequences(prompt_batch())
    old = group.compute_log_prob(out).batch["old_log_probs"]
    group.update_actor(with_advantages(out, [1.0, -1.0, 1.0, -1.0], old))
    group.export_hf(str(tmp_path / "hf"))
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        logits = exported(input_ids=out.batch["input_ids"], attention_mask=out.batch["attention_mask"],
                          position_ids=out.batch["position_ids"]).logits
    prompt_len = out.batch["prompts"].shape[1]
    log_probs = torch.log_softmax(logits[:, prompt_len - 1 : -1], -1).gather(-1, out.batch["responses"][..., None])
    mask = out.batch["response_mask"].bool()
    actor = group.compute_log_prob(out).batch["old_log_probs"]
    assert (log_probs.squeeze(-1) - actor)[mask].abs().max() < 1e-5


def _first_new_token(row: torch.Tensor) -> tuple[int, int]:
    """(position, token) of the first token of ``row`` after position 0 not seen before it."""
    for pos in range(1, row.shape[0]):
        if int(row[pos]) not in row[:pos].tolist():
            return pos, int(row[pos])
    raise AssertionError(f"no new token in {row.tolist()}")


def test_eos_stops_a_row_and_ignore_eos_forces_full_length(model_dir):
    eight = "actor_rollout_ref.rollout.response_length=8"
    group = local_group(ActorRolloutRefWorker, make_config(model_dir, eight), "rollout")
    state = group.get_rng_state()
    sampled = group.generate_sequences(prompt_batch()).batch["responses"]
    pos, eos = _first_new_token(sampled[0])
    group.set_rng_state(state)
    stopped = group.generate_sequences(prompt_batch(eos_token_id=eos, pad_token_id=0)).batch
    assert stopped["response_mask"][0].tolist() == [1] * (pos + 1) + [0] * (7 - pos)
    assert stopped["responses"][0].tolist() == sampled[0, : pos + 1].tolist() + [0] * (7 - pos)
    assert stopped["rollout_log_probs"][0, pos + 1 :].abs().sum() == 0
    assert stopped["attention_mask"][0, -8:].tolist() == stopped["response_mask"][0].tolist()
    forced = local_group(ActorRolloutRefWorker,
                         make_config(model_dir, eight, "actor_rollout_ref.rollout.ignore_eos=true"), "rollout")
    forced.set_rng_state(state)
    full = forced.generate_sequences(prompt_batch(eos_token_id=eos)).batch
    assert full["response_mask"].sum() == 4 * 8 and torch.equal(full["responses"], sampled)


def test_stop_string_ends_the_response_where_it_completes(model_dir):
    config = make_config(model_dir, "actor_rollout_ref.rollout.response_length=8")
    probe = local_group(ActorRolloutRefWorker, config, "rollout")
    state = probe.get_rng_state()
    sampled = probe.generate_sequences(prompt_batch()).batch["responses"]
    tokenizer = probe._workers[0].tokenizer
    text = tokenizer.decode(sampled[1, 2:4].tolist())
    config.actor_rollout_ref.rollout.stop = [text]
    group = local_group(ActorRolloutRefWorker, config, "rollout")
    group.set_rng_state(state)
    out = group.generate_sequences(prompt_batch()).batch
    eos = tokenizer.eos_token_id
    for row in range(4):
        length = int(out["response_mask"][row].sum())
        kept = tokenizer.decode(out["responses"][row, :length].tolist())
        assert text not in tokenizer.decode(out["responses"][row, : length - 1].tolist())
        if length < 8:
            assert text in kept or int(out["responses"][row, length - 1]) == eos
    assert int(out["response_mask"][1].sum()) <= 4
    assert text in tokenizer.decode(out["responses"][1, : int(out["response_mask"][1].sum())].tolist())


def test_sampling_is_seeded_and_the_rng_state_round_trips(model_dir):
    a, b = hybrid(model_dir), hybrid(model_dir)
    state = a.get_rng_state()
    first = a.generate_sequences(prompt_batch()).batch["responses"]
    assert torch.equal(first, b.generate_sequences(prompt_batch()).batch["responses"])
    second = a.generate_sequences(prompt_batch()).batch["responses"]
    assert not torch.equal(first, second)
    a.set_rng_state(state)
    assert torch.equal(first, a.generate_sequences(prompt_batch()).batch["responses"])


def test_role_without_the_part_raises_a_clear_error(model_dir):
    ref = local_group(ActorRolloutRefWorker, make_config(model_dir), "ref")
    message = r"ActorRolloutRefWorker\(role='ref'\) has no rollout, so it cannot run generate_sequences"
    with pytest.raises(Exception, match=message):
        ref.generate_sequences(prompt_batch())
    with pytest.raises(ValueError, match="role must be one of"):
        ActorRolloutRefWorker(make_config(model_dir), "critic")


def test_gradient_checkpointing_gives_the_same_update(model_dir):
    group = hybrid(model_dir)
    out = group.generate_sequences(prompt_batch())
    old = group.compute_log_prob(out).batch["old_log_probs"] - 0.05
    plain, _ = _grad_norm_and_weights(model_dir, out, old, "actor_rollout_ref.model.lora_rank=4")
    checkpointed, _ = _grad_norm_and_weights(model_dir, out, old, "actor_rollout_ref.model.lora_rank=4",
                                             "actor_rollout_ref.model.enable_gradient_checkpointing=true")
    assert checkpointed["actor/grad_norm"][0] == pytest.approx(plain["actor/grad_norm"][0], rel=1e-5)


def test_bfloat16_actor_does_not_reuse_inexact_rollout_log_probs(model_dir):
    group = hybrid(model_dir, "actor_rollout_ref.model.dtype=bfloat16")
    out = group.generate_sequences(prompt_batch())
    assert out.meta_info["rollout_log_probs_exact"] is False
    scored = group.compute_log_prob(out)
    assert scored.meta_info["metrics"]["actor/reused_rollout_log_probs"] == [0.0]
    mask = out.batch["response_mask"].bool()
    assert (scored.batch["old_log_probs"] - out.batch["rollout_log_probs"])[mask].abs().max() < 0.1
    metrics = group.update_actor(with_advantages(out, [1.0, -1.0, 1.0, -1.0], scored.batch["old_log_probs"]))
    assert metrics.meta_info["metrics"]["actor/skipped_steps"] == [0.0]


def test_repeated_prompts_are_prefilled_once_with_the_same_result(model_dir, monkeypatch):
    group = hybrid(model_dir)
    single = group.generate_sequences(prompt_batch(validate=True)).batch
    prefilled_rows = []
    prefill = DynamicCacheDecoder.prefill

    def counting_prefill(self, input_ids, *args, **kwargs):
        prefilled_rows.append(input_ids.shape[0])
        return prefill(self, input_ids, *args, **kwargs)

    monkeypatch.setattr(DynamicCacheDecoder, "prefill", counting_prefill)
    # runs of n as the trainer sends them, and an irregular batch (prompts repeated 2, 3 and 1 times)
    for rows in ([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3], [0, 0, 1, 1, 1, 2], [2, 0, 2, 1]):
        prefilled_rows.clear()
        batch = prompt_batch(validate=True)[rows]
        out = group.generate_sequences(batch).batch
        assert prefilled_rows == [len(set(rows))]
        assert torch.equal(out["responses"], single["responses"][rows])
        assert torch.allclose(out["rollout_log_probs"], single["rollout_log_probs"][rows], atol=1e-5)

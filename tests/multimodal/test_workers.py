"""Rollout, log-probs, update, reference and critic with images, on the tiny Qwen2-VL and Qwen2.5-VL
(one local rank, fp32), against an independent forward of each row."""

from __future__ import annotations

import pytest
import torch
from mm_helpers import COLOURS, image_batch, make_config, picture, reference_log_probs

from rlvr.protocol import DataProto
from rlvr.single_controller import ClassWithInitArgs, LocalResourcePool, LocalWorkerGroup
from rlvr.utils.dataproto_ops import to_object_array
from rlvr.utils.model import load_causal_lm
from rlvr.utils.multimodal import MULTI_MODAL_INPUTS, MultiModalRows, model_inputs, rope_index
from rlvr.utils.tokenizer import hf_processor
from rlvr.workers.engine_workers import ActorRolloutRefWorker, CriticWorker

KINDS = ("qwen2_vl", "qwen2_5_vl")


def group(cls, *args):
    made = LocalWorkerGroup(LocalResourcePool(), ClassWithInitArgs(cls, *args))
    made.init_model()
    return made


def rollout(model_dir, image_data, *overrides, n=2):
    hybrid = group(ActorRolloutRefWorker, make_config(model_dir, *overrides), "actor_rollout_ref")
    out = hybrid.generate_sequences(image_batch(model_dir, image_data, n=n))
    out.meta_info["temperature"] = 1.0
    return hybrid, out


def with_image(batch: DataProto, row: int, image, processor) -> DataProto:
    """``batch`` with the image of ``row`` replaced (same size, so the same tokens)."""
    inputs = list(batch.non_tensor_batch[MULTI_MODAL_INPUTS])
    new = processor.image_processor(images=[image], return_tensors="pt")
    inputs[row] = {"pixel_values": new["pixel_values"], "image_grid_thw": new["image_grid_thw"]}
    changed = batch.select()
    changed.non_tensor_batch = {**changed.non_tensor_batch, MULTI_MODAL_INPUTS: to_object_array(inputs)}
    return changed


@pytest.mark.parametrize("kind", KINDS)
def test_rollout_log_probs_equal_an_fp32_forward_with_the_same_images(kind, vl_dirs, image_data):
    hybrid, out = rollout(vl_dirs[kind], image_data, "actor_rollout_ref.rollout.ignore_eos=true")
    assert len(out) == 8 and out.non_tensor_batch[MULTI_MODAL_INPUTS].shape == (8,)
    mask = out.batch["response_mask"].bool()
    reference = reference_log_probs(load_causal_lm(vl_dirs[kind]), out)
    assert (out.batch["rollout_log_probs"] - reference)[mask].abs().max() < 1e-5
    actor = hybrid.compute_log_prob(out).batch["old_log_probs"]
    assert (actor - reference)[mask].abs().max() < 1e-5
    ref = hybrid.compute_ref_log_prob(out).batch["ref_log_prob"]
    assert (ref - reference)[mask].abs().max() < 1e-5


@pytest.mark.parametrize("kind", KINDS)
def test_one_dimensional_positions_would_be_caught(kind, vl_dirs, image_data):
    """The check above is sensitive to the silent 1-D fallback: with the batch's 1-D positions the
    log-probs of an image prompt move by far more than 1e-5 (Qwen2.5-VL takes them without a word)."""
    model = load_causal_lm(vl_dirs[kind])
    batch = image_batch(vl_dirs[kind], image_data)
    rows = MultiModalRows(batch.non_tensor_batch[MULTI_MODAL_INPUTS])
    ids, mask, positions = (batch.batch[k] for k in ("input_ids", "attention_mask", "position_ids"))
    inputs = model_inputs(model, ids, mask, positions, rows)
    assert inputs["position_ids"].shape == (3, 4, ids.shape[1])
    assert torch.equal(inputs["position_ids"], rope_index(model, ids, mask, rows.merged())[0])
    with torch.no_grad():
        right = torch.log_softmax(model(**inputs).logits, dim=-1)
        flat = torch.log_softmax(model(**{**inputs, "position_ids": positions}).logits, dim=-1)
    assert (right - flat)[mask.bool()].abs().max() > 1e-4


@pytest.mark.parametrize("kind", KINDS)
def test_an_image_changed_in_one_row_changes_only_that_rows_log_probs(kind, vl_dirs, image_data):
    hybrid, out = rollout(vl_dirs[kind], image_data)
    before = hybrid.compute_log_prob(out).batch["old_log_probs"]
    # row 4 holds a 56x56 image, like the new one; row 5 has the same prompt ids and (still) the old image
    changed = with_image(out, 4, picture(COLOURS[3], mark=3), hf_processor(vl_dirs[kind]))
    after = hybrid.compute_log_prob(changed).batch["old_log_probs"]
    mask = out.batch["response_mask"].bool()
    moved = ((after - before).abs() * mask).amax(dim=-1)
    assert moved[4] > 1e-4
    assert torch.all(moved[[0, 1, 2, 3, 5, 6, 7]] < 1e-6), moved


def test_the_update_trains_with_the_images_and_the_shared_prompt_forward_is_exact(vl_dirs, image_data):
    model_dir = vl_dirs["qwen2_5_vl"]
    results = {}
    for share in ("true", "false"):
        hybrid, out = rollout(model_dir, image_data, "actor_rollout_ref.actor.optim.lr=0.01",
                              "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                              "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
                              f"actor_rollout_ref.actor.share_prompt_forward={share}")
        old = hybrid.compute_log_prob(out).batch["old_log_probs"]
        mask = out.batch["response_mask"]
        out.batch["old_log_probs"] = old
        advantages = torch.tensor([1.0, -1.0] * 4)
        out.batch["advantages"] = advantages[:, None] * mask
        metrics = hybrid.update_actor(out).meta_info["metrics"]
        new = hybrid.compute_log_prob(out).batch["old_log_probs"]
        change = ((new - old) * mask).sum(-1)  # the step raises A-weighted log-likelihood
        assert (change[0::2] > 0).all() and float((advantages * change).sum()) > 0, change
        results[share] = metrics["actor/grad_norm"][0]
    assert results["true"] == pytest.approx(results["false"], rel=1e-5)


def test_the_critic_reads_the_images(vl_dirs, image_data):
    model_dir = vl_dirs["qwen2_vl"]
    _, out = rollout(model_dir, image_data, n=1)
    critic = group(CriticWorker, make_config(model_dir, "critic.enable=true", "critic.optim.lr=0.01"))
    values = critic.compute_values(out).batch["values"]
    changed = critic.compute_values(with_image(out, 0, picture(COLOURS[2], mark=1), hf_processor(model_dir)))
    changed = changed.batch["values"]
    mask = out.batch["response_mask"].bool()
    moved = ((changed - values).abs() * mask).amax(dim=-1)
    assert moved[0] > 1e-5 and torch.all(moved[1:] < 1e-6)
    out.batch["values"], out.batch["returns"] = values, values + 1.0
    metrics = critic.update_critic(out).meta_info["metrics"]
    assert metrics["critic/vf_loss"][0] == pytest.approx(0.5, rel=1e-4)  # 0.5 * (returns - values)^2, clipped
    after = critic.compute_values(out).batch["values"]
    assert ((after - values) * mask).sum() > 0  # the values moved toward the returns


def test_freeze_vision_tower_keeps_the_vision_encoder_out_of_training(vl_dirs):
    """verl's actor.freeze_vision_tower: the vision encoder's parameters do not train; the language
    model's do."""
    from rlvr.workers.models import build_causal_lm

    model = make_config(vl_dirs["qwen2_vl"]).actor_rollout_ref.model
    frozen = build_causal_lm(model, trainable=True, freeze_vision=True)
    trains = {name.split(".")[1] for name, p in frozen.named_parameters() if p.requires_grad}
    assert not any(p.requires_grad for name, p in frozen.named_parameters() if ".visual." in f".{name}.")
    assert "language_model" in trains
    assert all(p.requires_grad for p in build_causal_lm(model, trainable=True).parameters())

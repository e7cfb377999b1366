"""verl 0.9 parity of the algorithm layer: positional parameter order of every public function,
positional verl-style calls give verl's numbers (hand-computed from verl's documented formulas),
groups of one and mixed group sizes, and the loss normalisation across data-parallel ranks."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch

from ppo_test_data import make_mask
from rlvr.trainer.ppo import core_algos as ca
from rlvr.utils import torch_functional as F

ESTIMATOR_HEAD = ["token_level_rewards", "response_mask", "index", "epsilon"]
LOSS = ["old_log_prob", "log_prob", "advantages", "response_mask", "loss_agg_mode", "config", "rollout_is_weights"]
VERL_ORDER = {
    ca.compute_gae_advantage_return: ["token_level_rewards", "values", "response_mask", "gamma", "lam"],
    ca.compute_grpo_outcome_advantage: [*ESTIMATOR_HEAD, "norm_adv_by_std_in_grpo", "config"],
    ca.compute_grpo_vectorized_outcome_advantage: [*ESTIMATOR_HEAD, "norm_adv_by_std_in_grpo", "config"],
    ca.compute_rloo_outcome_advantage: [*ESTIMATOR_HEAD, "config"],
    ca.compute_rloo_vectorized_outcome_advantage: [*ESTIMATOR_HEAD, "config"],
    ca.compute_opo_outcome_advantage: [*ESTIMATOR_HEAD, "config"],
    ca.compute_reinforce_plus_plus_baseline_outcome_advantage: [*ESTIMATOR_HEAD, "config"],
    ca.compute_gpg_outcome_advantage: [*ESTIMATOR_HEAD, "f_norm", "alpha", "config"],
    ca.compute_reinforce_plus_plus_outcome_advantage: ["token_level_rewards", "response_mask", "config"],
    ca.compute_remax_outcome_advantage: ["token_level_rewards", "reward_baselines", "response_mask", "config"],
    ca.compute_gdpo_outcome_advantage: [*ESTIMATOR_HEAD, "norm_adv_by_std_in_grpo", "config", "non_tensor_batch",
                                        "batch"],
    ca.compute_grpo_passk_outcome_advantage: [*ESTIMATOR_HEAD, "norm_adv_by_std_in_grpo", "config"],
    **{fn: ["token_level_rewards", "response_mask", "index", "old_log_probs", "sum_pi_squared", "rollout_is_weights",
            "handle_zero_tail", "epsilon"]
       for fn in (ca.compute_optimal_token_baseline_advantage,
                  ca.compute_multi_turn_optimal_token_baseline_advantage)},
    ca.compute_policy_loss_reinforce: ["rollout_log_prob", "log_prob", "advantages", "response_mask", "loss_agg_mode",
                                       "config", "rollout_is_weights"],
    ca.agg_loss: ["loss_mat", "loss_mask", "loss_agg_mode", "dp_size", "batch_num_tokens", "global_batch_size",
                  "loss_scale_factor"],
    ca.compute_value_loss: ["vpreds", "returns", "values", "response_mask", "cliprange_value", "loss_agg_mode",
                            "dp_size", "batch_num_tokens", "global_batch_size", "loss_scale_factor"],
    ca.compute_policy_loss: ["old_log_prob", "log_prob", "advantages", "response_mask", "cliprange", "cliprange_low",
                             "cliprange_high", "clip_ratio_c", "loss_agg_mode"],
    ca.compute_entropy_loss: ["logits", "response_mask", "loss_agg_mode"],
    ca.compute_rewards: ["token_level_scores", "old_log_prob", "ref_log_prob", "kl_ratio"],
    ca.kl_penalty: ["logprob", "ref_logprob", "kl_penalty"],
    ca.kl_penalty_forward: ["logprob", "ref_logprob", "kl_penalty"],
    ca.get_kl_controller: ["kl_ctrl"],
    ca.AdaptiveKLController: ["init_kl_coef", "target_kl", "horizon"],
    ca.FixedKLController: ["kl_coef"],
    ca.register_adv_est: ["name_or_enum"],
    ca.get_adv_estimator_fn: ["name_or_enum"],
    ca.register_policy_loss: ["name"],
    ca.get_policy_loss_fn: ["name"],
    **{fn: LOSS for fn in (ca.compute_policy_loss_vanilla, ca.compute_policy_loss_gspo, ca.compute_policy_loss_gpg,
                           ca.compute_policy_loss_cispo, ca.compute_policy_loss_clip_cov,
                           ca.compute_policy_loss_kl_cov, ca.compute_policy_loss_geo_mean, ca.compute_policy_loss_dppo_tv,
                           ca.compute_policy_loss_dppo_kl, ca.compute_policy_loss_sapo, ca.compute_policy_loss_dro,
                           ca.compute_policy_loss_bypass_mode)},
    F.masked_sum: ["values", "mask", "axis"],
    F.masked_mean: ["values", "mask", "axis"],
    F.masked_var: ["values", "mask", "unbiased"],
    F.masked_whiten: ["values", "mask", "shift_mean"],
    F.clip_by_value: ["x", "tensor_min", "tensor_max"],
    F.gather_from_labels: ["data", "label"],
    F.logprobs_from_logits: ["logits", "labels"],
    F.entropy_from_logits: ["logits"],
    F.entropy_from_logits_with_chunking: ["logits", "chunk_size"],
    F.calculate_sum_pi_squared_from_logits: ["logits"],
    F.expand_as_nested: ["tensor", "nested_tensor"],
    F.get_response_mask: ["response_id", "eos_token", "dtype"],
    F.pad_sequence_to_length: ["tensors", "max_seq_len", "pad_token_id", "left_pad"],
    F.pad_2d_list_to_length: ["response", "pad_token_id", "max_length"],
}


@pytest.mark.parametrize("fn", list(VERL_ORDER), ids=lambda fn: fn.__name__)
def test_positional_order_is_verls(fn):
    params = [p for p in inspect.signature(fn).parameters if p not in ("self", "kwargs")]
    assert params[:len(VERL_ORDER[fn])] == VERL_ORDER[fn]
    assert all(inspect.signature(fn).parameters[p].kind != inspect.Parameter.KEYWORD_ONLY for p in VERL_ORDER[fn])


def test_gae_positional_call_in_verls_order():
    """``(rewards, values, mask, gamma, lam)``: with the masked token's value 9 in the way, a call
    that swapped values and mask would give other numbers (or fail)."""
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.2, 0.1, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    adv, returns = ca.compute_gae_advantage_return(rewards, values, mask, 0.9, 0.8)
    # A2 = 1 - 0.1 = 0.9; A1 = (0.9 * 0.1 - 0.2) + 0.72 * 0.9 = 0.538; A0 = (0.18 - 0.5) + 0.72 * 0.538
    raw = torch.tensor([0.06736, 0.538, 0.9])
    torch.testing.assert_close(returns, torch.tensor([[0.56736, 0.738, 1.0, 0.0]]))
    whitened = (raw - raw.mean()) / torch.sqrt(raw.var() + 1e-8)
    torch.testing.assert_close(adv, torch.cat([whitened, torch.zeros(1)]).unsqueeze(0))


def test_remax_positional_call_in_verls_order():
    rewards, mask = torch.tensor([[0.0, 1.0], [2.0, 0.0]]), torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv, returns = ca.compute_remax_outcome_advantage(rewards, torch.tensor([0.25, 1.5]), mask)
    torch.testing.assert_close(returns, torch.tensor([[1.0, 1.0], [2.0, 0.0]]))
    torch.testing.assert_close(adv, torch.tensor([[0.75, 0.75], [0.5, 0.0]]))


def _outcome(scores):
    return torch.tensor(scores, dtype=torch.float32).unsqueeze(-1), torch.ones(len(scores), 1)


def test_groups_of_one_and_mixed_sizes_give_verls_numbers():
    """verl: a group of one has mean 0 and std 1 (its advantage is its normalised score); groups of
    3 and 2 use their own mean / unbiased std / leave-one-out mean / length-weighted mean."""
    rewards, mask = _outcome([1.0, 0.0, 0.5, 2.0, 0.0, 0.7])
    index = np.array(["a", "a", "a", "b", "b", "c"], dtype=object)
    eps = 1e-6
    a_mean, a_std = 0.5, 0.5  # [1, 0, 0.5]
    b_mean, b_std = 1.0, math.sqrt(2.0)  # [2, 0]
    grpo = [(1 - a_mean) / (a_std + eps), (0 - a_mean) / (a_std + eps), 0.0, (2 - b_mean) / (b_std + eps),
            (0 - b_mean) / (b_std + eps), 0.7 / (1 + eps)]
    for fn in (ca.compute_grpo_outcome_advantage, ca.compute_grpo_vectorized_outcome_advantage):
        adv, _ = fn(rewards, mask, index)
        torch.testing.assert_close(adv.squeeze(-1), torch.tensor(grpo))
        adv, _ = fn(rewards, mask, index, eps, False)  # Dr.GRPO, positional
        torch.testing.assert_close(adv.squeeze(-1), torch.tensor([0.5, -0.5, 0.0, 1.0, -1.0, 0.7]))
    adv, _ = ca.compute_rloo_outcome_advantage(rewards, mask, index)
    torch.testing.assert_close(adv.squeeze(-1), torch.tensor([1 - 0.25, 0 - 0.75, 0.5 - 0.5, 2.0, -2.0, 0.7]))
    adv, _ = ca.compute_rloo_vectorized_outcome_advantage(rewards, mask, index)
    torch.testing.assert_close(adv.squeeze(-1), torch.tensor([1 - 0.25, 0 - 0.75, 0.5 - 0.5, 2.0, -2.0, 0.0]))
    adv, _ = ca.compute_opo_outcome_advantage(rewards, mask, index)  # equal lengths: the plain mean
    torch.testing.assert_close(adv.squeeze(-1), torch.tensor([0.5, -0.5, 0.0, 1.0, -1.0, 0.7]))
    adv, _ = ca.compute_gpg_outcome_advantage(rewards, mask, index)  # alpha = 6 rows / 4 non-zero scores
    torch.testing.assert_close(adv.squeeze(-1), 1.5 * torch.tensor([0.5, -0.5, 0.0, 1.0, -1.0, 0.7]))
    adv, _ = ca.compute_gpg_outcome_advantage(rewards, mask, index, eps, 2.0)  # f_norm divides
    torch.testing.assert_close(adv.squeeze(-1), 0.75 * torch.tensor([0.5, -0.5, 0.0, 1.0, -1.0, 0.7]))
    adv, _ = ca.compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, index)
    centred = torch.tensor([0.5, -0.5, 0.0, 1.0, -1.0, 0.7])
    torch.testing.assert_close(adv.squeeze(-1), (centred - centred.mean()) / torch.sqrt(centred.var() + 1e-8))


# ------------------------------------------------------------------------- data-parallel normalisation
def _split(loss, mask):
    """Rows 0-3 to rank 0, rows 4-7 to rank 1."""
    return [(loss[:4], mask[:4]), (loss[4:], mask[4:])]


@pytest.mark.parametrize("mode", ca.AGG_LOSS_MODES)
def test_agg_loss_over_ranks_averages_to_the_whole_batch_loss(mode):
    """DDP/FSDP average the ranks' gradients: the mean over ranks of ``agg_loss(rank part, dp_size=2,
    global counts)`` is the loss of the whole batch, also when the ranks hold different token counts."""
    gen = torch.Generator().manual_seed(0)
    loss = torch.randn(8, 7, generator=gen, requires_grad=True)
    mask = make_mask(empty_row=True)
    whole = ca.agg_loss(loss, mask, mode)
    tokens, sequences = mask.sum(), (mask.sum(-1) > 0).sum()
    parts = [ca.agg_loss(part, part_mask, mode, 2, tokens, sequences) for part, part_mask in _split(loss, mask)]
    torch.testing.assert_close(sum(parts) / 2, whole)
    grad_whole = torch.autograd.grad(whole, loss)[0]
    grad_parts = torch.autograd.grad(sum(parts) / 2, loss)[0]
    torch.testing.assert_close(grad_parts, grad_whole)


def test_agg_loss_needs_the_global_counts_on_several_ranks():
    loss, mask = torch.ones(2, 3), torch.ones(2, 3)
    with pytest.raises(ValueError, match="batch_num_tokens"):
        ca.agg_loss(loss, mask, "token-mean", dp_size=2)
    with pytest.raises(ValueError, match="global_batch_size"):
        ca.agg_loss(loss, mask, "seq-mean-token-mean", dp_size=2)
    assert ca.agg_loss(loss, mask, "token-sum", dp_size=2).item() == 12.0  # the local sum times the ranks
    assert ca.agg_loss(loss, mask, "token-mean", batch_num_tokens=12).item() == 0.5  # a global count, 1 rank


def test_compute_value_loss_passes_the_normalisation_on():
    vpreds, returns, values = torch.tensor([[1.0, 2.0]]), torch.tensor([[0.0, 0.0]]), torch.tensor([[1.0, 2.0]])
    mask = torch.ones(1, 2)
    vf_loss, clipfrac = ca.compute_value_loss(vpreds, returns, values, mask, 0.5, "token-mean")
    assert vf_loss.item() == pytest.approx(0.5 * (1 + 4) / 2) and clipfrac.item() == 0.0
    vf_loss, _ = ca.compute_value_loss(vpreds, returns, values, mask, 0.5, "token-mean", 2, 10)
    assert vf_loss.item() == pytest.approx(0.5 * 5 / 10 * 2)
    vf_loss, _ = ca.compute_value_loss(vpreds, returns, values, mask, 0.5, "seq-mean-token-sum-norm",
                                       loss_scale_factor=5)
    assert vf_loss.item() == pytest.approx(0.5 * 5 / 5)


def test_compute_rewards_and_entropy_loss():
    scores, old, ref = torch.tensor([[0.0, 1.0]]), torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]])
    torch.testing.assert_close(ca.compute_rewards(scores, old, ref, 0.1), torch.tensor([[-0.05, 1.1]]))
    logits = torch.zeros(1, 2, 4)
    mask = torch.tensor([[1.0, 0.0]])
    assert ca.compute_entropy_loss(logits, mask).item() == pytest.approx(math.log(4))


def test_kl_penalty_forward_and_straight_through():
    logprob = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    ref = torch.tensor([[-2.0, -1.0]])
    forward = ca.kl_penalty_forward(logprob, ref, "k3")
    value = ca.kl_penalty(logprob, ref, "k3+")
    torch.testing.assert_close(value, forward)  # the value of k3 ...
    (grad,) = torch.autograd.grad(value.sum(), logprob)
    torch.testing.assert_close(grad, (logprob - ref).detach())  # ... with the gradient of k2 = 0.5 (lp - ref)^2
    with pytest.raises(NotImplementedError, match="unknown KL estimator 'k9'"):  # verl raises NotImplementedError
        ca.kl_penalty(logprob, ref, "k9")

"""The PPO update loop (rlvr.workers.ppo_update): loss shares, gradient accumulation, the optimizer step."""

import pytest
import torch

from rlvr.trainer.ppo.core_algos import AGG_LOSS_MODES, agg_loss
from rlvr.workers.ppo_update import loss_share, optimizer_step, run_ppo_epochs, update_mini_batch


def test_loss_share_token_mean_and_seq_mean():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])  # 3 tokens, 2 sequences in this micro-batch
    # token-mean: 3 of 12 global tokens, times world size 2
    assert loss_share(mask, 12.0, 8.0, "token-mean", 2) == pytest.approx(0.5)
    # seq-mean: 2 of 8 global sequences
    assert loss_share(mask, 12.0, 8.0, "seq-mean-token-mean", 1) == pytest.approx(0.25)
    empty_row = torch.tensor([[1, 1, 0], [0, 0, 0]])
    assert loss_share(empty_row, 12.0, 4.0, "seq-mean-token-sum", 1) == pytest.approx(0.25)
    assert loss_share(mask, 12.0, 8.0, "token-sum", 2) == 2.0  # only FSDP's averaging over ranks to undo


@pytest.mark.parametrize("mode", AGG_LOSS_MODES)
def test_micro_batch_losses_weighted_by_their_share_give_the_mini_batch_loss(mode):
    gen = torch.Generator().manual_seed(0)
    loss = torch.randn(6, 5, generator=gen)
    mask = (torch.rand(6, 5, generator=gen) > 0.3).long()
    mask[4] = 0  # a padding row
    tokens, sequences = float(mask.sum()), float((mask.sum(-1) > 0).sum())
    total = sum(agg_loss(loss[rows], mask[rows], mode) * loss_share(mask[rows], tokens, sequences, mode, 1)
                for rows in ([0, 1], [2, 3, 4], [5]))
    torch.testing.assert_close(total, agg_loss(loss, mask, mode))


def _token_mean_loss(layer: torch.nn.Linear, micro: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-mean of (w . x_t)^2 over the micro-batch's valid tokens; metric = the loss."""
    values = (micro["x"] @ layer.weight.T).squeeze(-1) ** 2  # [b, R]
    mask = micro["response_mask"].float()
    loss = (values * mask).sum() / mask.sum()
    return loss, loss.detach().reshape(1)


@pytest.mark.parametrize("micro_batches", [[[0, 1, 2]], [[0], [1, 2]], [[2], [0], [1]]])
def test_accumulated_micro_batches_take_the_step_of_the_whole_mini_batch(micro_batches):
    torch.manual_seed(0)
    mini = {"x": torch.randn(3, 4, 2), "response_mask": torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0]])}
    layer = torch.nn.Linear(2, 1, bias=False)
    start = layer.weight.detach().clone()
    # reference: one token-mean loss over the 6 valid tokens, one plain SGD step of lr 0.1
    reference = start.clone().requires_grad_(True)
    values = (mini["x"] @ reference.T).squeeze(-1) ** 2
    full_loss = (values * mini["response_mask"]).sum() / mini["response_mask"].sum()
    full_loss.backward()
    expected = start - 0.1 * reference.grad
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    update = update_mini_batch(layer, optimizer, mini, micro_batches, lambda m: _token_mean_loss(layer, m), 1,
                               loss_agg_mode="token-mean", grad_clip=1e9, world_size=1, device=torch.device("cpu"))
    assert update.stepped and update.grad_norm == pytest.approx(float(reference.grad.norm()), rel=1e-5)
    assert update.metric_sums.tolist() == pytest.approx([float(full_loss.detach())], rel=1e-6)
    assert torch.allclose(layer.weight, expected, atol=1e-6)
    assert layer.weight.grad is None  # cleared after the step


def test_optimizer_step_skips_a_non_finite_gradient_and_clears_it():
    layer = torch.nn.Linear(2, 1, bias=False)
    before = layer.weight.detach().clone()
    optimizer = torch.optim.SGD(layer.parameters(), lr=1.0)
    layer.weight.grad = torch.tensor([[float("inf"), 1.0]])
    grad_norm, stepped = optimizer_step(layer, optimizer, 1.0)
    assert grad_norm == float("inf") and not stepped
    assert torch.equal(layer.weight, before) and layer.weight.grad is None
    layer.weight.grad = torch.tensor([[3.0, 4.0]])
    grad_norm, stepped = optimizer_step(layer, optimizer, 1.0)  # clipped to norm 1: step of (0.6, 0.8)
    assert grad_norm == pytest.approx(5.0) and stepped
    assert torch.allclose(layer.weight, before - torch.tensor([[0.6, 0.8]]), atol=1e-6)


def test_epochs_visit_every_mini_batch_in_order_without_shuffle():
    batch = {"row": torch.arange(5)}
    seen = []

    def train(mini):
        seen.append(mini["row"].tolist())
        return {"rows": float(len(mini["row"]))}

    metrics = run_ppo_epochs(batch, train, epochs=2, mini_batch_size=2, shuffle=False)
    assert seen == [[0, 1], [2, 3], [4], [0, 1], [2, 3], [4]]
    assert metrics == {"rows": [2.0, 2.0, 1.0, 2.0, 2.0, 1.0]}

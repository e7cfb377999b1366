"""Micro-batch splitting and loss weights (rlvr.workers.batching)."""

import pytest
import torch

from rlvr.trainer.ppo.core_algos import AGG_LOSS_MODES, agg_loss
from rlvr.workers.batching import loss_share, micro_batch_indices, token_budget_partitions


def test_token_budget_packs_longest_first_within_budget():
    # lengths 5, 3, 8, 2, 4 with budget 10: [8] (2x8 > 10), [5, 4] (2x5 = 10), [3, 2] (2x3 = 6, 3x3 > 10 no 3rd row)
    parts = token_budget_partitions([5, 3, 8, 2, 4], max_token_len=10)
    assert parts == [[2], [0, 4], [1, 3]]


def test_token_budget_row_longer_than_budget_gets_its_own_micro_batch():
    assert token_budget_partitions([20, 1, 1], max_token_len=4) == [[0], [1, 2]]


def test_token_budget_splits_biggest_until_min_parts():
    parts = token_budget_partitions([2, 2, 2, 2], max_token_len=100, min_parts=3)
    assert sorted(len(p) for p in parts) == [1, 1, 2]
    assert sorted(i for p in parts for i in p) == [0, 1, 2, 3]


def test_token_budget_rejects_more_parts_than_rows():
    with pytest.raises(ValueError, match="cannot make 3 micro-batches out of 2 rows"):
        token_budget_partitions([1, 1], max_token_len=10, min_parts=3)


def test_micro_batch_indices_by_count():
    assert micro_batch_indices(torch.tensor([3, 3, 3, 3, 3]), 2, False, 0, 1) == [[0, 1], [2, 3], [4]]


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

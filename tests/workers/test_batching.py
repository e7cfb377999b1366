"""Micro-batch splitting (rlvr.workers.batching)."""

import pytest
import torch

from rlvr.workers.batching import micro_batch_indices, token_budget_partitions


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

